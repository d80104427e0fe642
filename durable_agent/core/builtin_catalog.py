"""The built-in tools' definitions (``BUILTIN_TOOLS``): what the model is told of each.

Temporal runs an activity at least once, so a tool call may run again after a
worker crash. What a repeat of each built-in tool does:

- ``read``, ``ls``, ``glob``, ``grep`` only read: a repeat changes nothing and
  answers from the files as they are then.
- ``write`` writes the same content again: harmless, and the result says the
  file already had that content.
- ``edit``: when ``old_string`` no longer occurs outside a copy of
  ``new_string`` and ``new_string`` is in the file, the edit is reported as
  already applied and nothing changes; so a repeat neither fails nor applies
  the edit twice, even when ``new_string`` contains ``old_string``. The one
  exception is a repeated deletion (empty ``new_string``): it fails as "not
  found", since nothing in the file shows the deletion was done.
- ``multi_edit`` writes the file once, with every edit or none. When every
  edit is in place (its ``old_string`` gone outside what the edits put in,
  and what it put in, as the later edits left it, present), the set is
  reported as already applied and nothing changes; otherwise each edit
  follows ``edit``'s rule, so one already in place is skipped and said so.
- ``apply_patch`` computes every file's change first, then writes them one
  by one (each atomically: added and updated files, then deletions), so a
  crash may leave some files changed. A repeat finds those changes in place
  and applies only the rest: an added file that has the patch's content, an
  update whose new lines are found (and its old ones are not, apart from
  inside the new), a deleted file that is missing and a moved file found at
  its destination count as done. When all are, the patch is reported as
  already applied and nothing changes.
- ``web_fetch`` fetches the page again (GET only).
- ``bash`` runs the command again. Commands that are not safe to repeat
  should be asked for (``ask``) or kept out of the ``allow`` rules.
- ``todo_write`` runs in no activity: the workflow answers it itself
  (``in_workflow``, ``durable_agent.core.todo_list``), once, as part of the
  run's deterministic history.
"""

from __future__ import annotations

from durable_agent.core.tool_args import (
    BASH_DEFAULT_TIMEOUT,
    BASH_MAX_TIMEOUT,
    BASH_OUTPUT_HEAD_BYTES,
    BASH_OUTPUT_TAIL_BYTES,
    GLOB_MAX_RESULTS,
    GREP_MAX_FILE_BYTES,
    GREP_MAX_LINE_CHARS,
    GREP_MAX_MATCHES,
    LS_MAX_ENTRIES,
    MULTI_EDIT_MAX_EDITS,
    PATCH_MAX_FILES,
    READ_MAX_BYTES,
    READ_MAX_LINE_CHARS,
    TODO_MAX_CONTENT_CHARS,
    TODO_MAX_ITEMS,
    WEB_FETCH_MAX_REDIRECTS,
    ApplyPatchArgs,
    BashArgs,
    EditArgs,
    GlobArgs,
    GrepArgs,
    LsArgs,
    MultiEditArgs,
    ReadArgs,
    TodoWriteArgs,
    WebFetchArgs,
    WriteArgs,
)
from durable_agent.core.tool_specs import ToolSpec

_REPEAT_READS = "Only reads, so it is safe to repeat."

BUILTIN_TOOLS: dict[str, ToolSpec] = {
    spec.name: spec
    for spec in (
        ToolSpec(
            "read",
            "Read a text file in the workspace. Returns its lines numbered from 1; `offset` (0-based) "
            f"and `limit` select lines. Output stops at {READ_MAX_BYTES} bytes and lines longer than "
            f"{READ_MAX_LINE_CHARS} characters are cut, with a note saying how to read on. A binary "
            f"file is reported, not shown. {_REPEAT_READS}",
            ReadArgs,
            "file_path",
            read_only=True,
            quick=True,
        ),
        ToolSpec(
            "ls",
            "List a folder in the workspace: one entry a line, with its kind and size "
            f"(at most {LS_MAX_ENTRIES} entries). {_REPEAT_READS}",
            LsArgs,
            "path",
            read_only=True,
            quick=True,
        ),
        ToolSpec(
            "write",
            "Create or overwrite a file in the workspace with `content` (UTF-8), creating missing "
            "parent folders. Says how many bytes were written and whether the file was created or "
            "replaced. Prefer `edit` for changing part of an existing file. Writing the same content "
            "again changes nothing.",
            WriteArgs,
            "file_path",
        ),
        ToolSpec(
            "edit",
            "Replace `old_string` with `new_string` in a file in the workspace. `old_string` must "
            "match the file exactly, whitespace included, and occur exactly once (add surrounding "
            "lines to make it unique), unless `replace_all` is true. When `old_string` no longer "
            "occurs (other than inside `new_string`) and `new_string` does, the edit is reported as "
            "already applied and nothing changes.",
            EditArgs,
            "file_path",
        ),
        ToolSpec(
            "multi_edit",
            "Make several replacements in one file in the workspace, in one step: each of `edits` is "
            "an `old_string`, a `new_string` and `replace_all`, as `edit` takes them, applied in order "
            "to the text the ones before left. Each must match as `edit` requires; if one fails, "
            f"nothing is written and the error names it. At most {MULTI_EDIT_MAX_EDITS} edits. When "
            "every edit is already in place, the set is reported as already applied and nothing "
            "changes.",
            MultiEditArgs,
            "file_path",
        ),
        ToolSpec(
            "apply_patch",
            "Add, change, move and delete files in the workspace with one patch in this format:\n"
            "*** Begin Patch\n"
            "*** Add File: path/new.py\n"
            "+each line of the new file, after a '+'\n"
            "*** Update File: path/old.py\n"
            "*** Move to: path/renamed.py   (optional)\n"
            "@@ def the_function():   (optional: a line above the change, to find the place)\n"
            " a context line (a space, then the line as it is)\n"
            "-a line to remove\n"
            "+a line to add\n"
            "*** Delete File: path/obsolete.py\n"
            "*** End Patch\n"
            "Give about 3 lines of context above and below each change, and start each further "
            "change in a file with '@@'. Paths are relative to the workspace. Context is matched "
            "exactly, then ignoring trailing whitespace, then ignoring surrounding whitespace. Every "
            "file's change is worked out before any is written: if one cannot be, nothing is written "
            f"and the error says why. At most {PATCH_MAX_FILES} files. Changes already in place are "
            "reported as such and not made again.",
            ApplyPatchArgs,
            "patch",
            targets_from="patch",
        ),
        ToolSpec(
            "glob",
            "Find files and folders in the workspace whose path matches a glob: `*` and `?` stay "
            "within one folder, `**` spans folders, `[abc]` and `{a,b}` work. Paths are relative to "
            f"the workspace, sorted, folders end in `/`; at most {GLOB_MAX_RESULTS}. .git, .hg and .svn "
            f"folders are not searched, nor links leading out of the workspace. {_REPEAT_READS}",
            GlobArgs,
            "pattern",
            read_only=True,
            quick=True,
        ),
        ToolSpec(
            "grep",
            "Search text files in the workspace for a regular expression in RE2 syntax (no "
            "backreferences, no lookahead or lookbehind), line by line. "
            "`path` limits the search to a folder or a file, `glob` to matching files. Results are "
            f"`file:line: text`, at most {GREP_MAX_MATCHES}, lines cut at {GREP_MAX_LINE_CHARS} "
            f"characters; binary files and files over {GREP_MAX_FILE_BYTES // (1024 * 1024)} MB are "
            f"skipped. {_REPEAT_READS}",
            GrepArgs,
            "pattern",
            target_is_path=False,
            read_only=True,
            quick=True,
        ),
        ToolSpec(
            "bash",
            "Run a command with /bin/bash -c in the workspace folder, stdin empty. Returns stdout and "
            f"stderr together (at most {BASH_OUTPUT_HEAD_BYTES + BASH_OUTPUT_TAIL_BYTES} bytes: the "
            "start and the end are kept) and the exit code. `timeout_seconds` (default "
            f"{BASH_DEFAULT_TIMEOUT}, at most {BASH_MAX_TIMEOUT}) stops the command and every process "
            "it started; processes still running when the command ends are stopped as well. The "
            "environment is minimal: no credentials, HOME is a fresh temporary folder. A repeated "
            "call runs the command again.",
            BashArgs,
            "command",
            target_is_path=False,
            repeatable=False,
        ),
        ToolSpec(
            "web_fetch",
            "Fetch a web page with GET. An HTML page is turned into markdown (links made absolute, "
            "scripts and styles left out); text and JSON are returned as they are; other content "
            "(images, PDFs, archives) is refused. Redirects are followed (at most "
            f"{WEB_FETCH_MAX_REDIRECTS}), each to a host the run's rules allow; private and "
            "loopback addresses are refused. The result starts with the final URL, the status and "
            f"the content type; the text shown stops at {READ_MAX_BYTES} bytes, with a note giving "
            "the `offset` to read on. A page larger than the worker's limit is cut. An HTTP error "
            f"status is a tool error. {_REPEAT_READS}",
            WebFetchArgs,
            "url",
            target_is_path=False,
            read_only=True,
        ),
        ToolSpec(
            "todo_write",
            "Keep a plan of the task as a checklist the person watching the run sees. Give the whole "
            "list each time (it replaces the one before): every task with its `content` and "
            "`status` (`pending`, `in_progress` or `completed`). Use it for work of several steps: "
            "write the plan first, mark a task `in_progress` when you start it (one at a time) and "
            "`completed` as soon as it is done, and add tasks you discover. At most "
            f"{TODO_MAX_ITEMS} tasks of {TODO_MAX_CONTENT_CHARS} characters. It changes no files.",
            TodoWriteArgs,
            None,
            in_workflow=True,
            # it changes nothing outside the run, and the workflow answers a step's calls of it in
            # their order whatever runs beside them: safe to batch with the reads
            read_only=True,
        ),
    )
}

__all__ = ["BUILTIN_TOOLS"]
