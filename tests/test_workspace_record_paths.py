"""``ShadowRepo.record`` by one ``git status`` and the paths it lists (``workspaces/record.py``):
in every case below the tree is the one ``git add -A && git write-tree`` gives, both as every
record did before (``_record_whole``, in a second shadow that follows the same steps: a file
tracked before it was ignored stays) and in a fresh scratch ``GIT_DIR``; and the short way made
it, not the whole way."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from durable_agent.activities.sinks import FilesystemExportSink
from durable_agent.activities.workspace_tree import WorkspaceTrees
from durable_agent.activities.workspaces.errors import WorkspaceTreeError
from durable_agent.activities.workspaces.record import changes_of, head_tree, too_large
from durable_agent.activities.workspaces.shadow import _ENV, _SETTINGS_FILE, Recorded, ShadowRepo
from durable_agent.config import WorkspaceCheckpointsConfig

EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"


def plain_tree(ws: Path, scratch: Path) -> str:
    """The tree a fresh ``git add -A && git write-tree`` gives, in a GIT_DIR of its own."""
    n = len(list(scratch.glob("plain-*"))) if scratch.exists() else 0
    git_dir = scratch / f"plain-{n}"
    env = {**os.environ, **_ENV, "GIT_DIR": str(git_dir), "GIT_WORK_TREE": str(ws)}

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ws, env=env, capture_output=True, check=True)
        return done.stdout.decode().strip()

    git_dir.mkdir(parents=True)
    git("init", "-q", "--template=")
    for key, value in (("core.autocrlf", "false"), ("core.symlinks", "true"), ("core.filemode", "true")):
        git("config", key, value)
    git("add", "-A")
    return git("write-tree")


class Shadow:
    """A workspace, its shadow, and each record checked against a plain ``git add -A``."""

    def __init__(self, tmp: Path, max_file_bytes: int = 1 << 20, max_total_bytes: int = 1 << 30) -> None:
        self.tmp = tmp
        self.ws = tmp / "ws"
        self.ws.mkdir(exist_ok=True)
        self.bounds = (max_file_bytes, max_total_bytes)
        self.repo = self.shadow(tmp / "shadows")
        self.whole = 0  # records that took the whole way
        # the same steps recorded the whole way, as before
        self.today = self.shadow(tmp / "today")
        whole = self.repo._record_whole

        def counted() -> Recorded:
            self.whole += 1
            return whole()

        self.repo._record_whole = counted  # type: ignore[method-assign]

    def shadow(self, root: Path) -> ShadowRepo:
        return ShadowRepo(root, self.ws, max_file_bytes=self.bounds[0], max_total_bytes=self.bounds[1])

    def record(self) -> Recorded:
        return self.repo.record()

    def check(self, *, left_out: tuple[str, ...] = (), fresh: bool = True) -> str:
        """Record, and compare with ``git add -A`` in the shadow that follows the same steps and
        (with ``fresh``: no file tracked before it was ignored) in a fresh one."""
        before = self.whole
        recorded = self.record()
        assert self.whole == before, "the record took the whole way"
        assert recorded.left_out == left_out
        self.today._init()
        self.today._write_excludes()
        today = self.today._record_whole()
        assert (recorded.tree, recorded.left_out) == (today.tree, today.left_out)
        if left_out:
            assert recorded.tree == self.fresh_whole()
        elif fresh:
            assert recorded.tree == plain_tree(self.ws, self.tmp / "scratch")
        # and HEAD names it, for the next record's ``status``
        assert head_tree(self.repo.git_dir) == recorded.tree
        return recorded.tree

    def fresh_whole(self) -> str:
        """What the whole way gives in a fresh shadow (``git add -A``, the size bounds)."""
        n = len(list((self.tmp / "scratch").glob("whole-*"))) if (self.tmp / "scratch").exists() else 0
        fresh = self.shadow(self.tmp / "scratch" / f"whole-{n}")
        fresh._init()
        fresh._write_excludes()
        return fresh._record_whole().tree

    def write(self, name: str | bytes, data: bytes = b"x\n") -> Path:
        path = Path(os.fsdecode(os.path.join(os.fsencode(self.ws), os.fsencode(name))))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return path


@pytest.fixture
def shadow(tmp_path: Path) -> Iterator[Shadow]:
    yield Shadow(tmp_path)


def test_an_empty_workspace_is_the_empty_tree_and_back_again(shadow: Shadow) -> None:
    assert shadow.check() == EMPTY_TREE
    shadow.write("a.txt")
    assert shadow.check() != EMPTY_TREE
    (shadow.ws / "a.txt").unlink()
    assert shadow.check() == EMPTY_TREE


def test_a_call_that_changed_nothing_writes_nothing(shadow: Shadow) -> None:
    shadow.write("src/a.py")
    tree = shadow.check()
    calls: list[str] = []
    git = shadow.repo.git

    def traced(*args: str, stdin: bytes | None = None) -> bytes:
        calls.append(args[0])
        return git(*args, stdin=stdin)

    shadow.repo.git = traced  # type: ignore[method-assign]
    assert shadow.record().tree == tree
    assert calls == ["status"]


def test_a_deleted_file_and_folder(shadow: Shadow) -> None:
    shadow.write("a.txt")
    shadow.write("d/b.txt")
    shadow.write("d/e/c.txt")
    shadow.check()
    (shadow.ws / "a.txt").unlink()
    shadow.check()
    for p in ("d/e/c.txt", "d/b.txt"):
        (shadow.ws / p).unlink()
    (shadow.ws / "d" / "e").rmdir()
    shadow.check()


def test_a_file_that_becomes_a_folder_and_a_folder_that_becomes_a_file(shadow: Shadow) -> None:
    shadow.write("f")
    shadow.write("d/a")
    shadow.write("d/b/c")
    shadow.check()
    (shadow.ws / "f").unlink()
    shadow.write("f/inside")
    shadow.check()
    for p in ("d/b/c", "d/a"):
        (shadow.ws / p).unlink()
    (shadow.ws / "d" / "b").rmdir()
    (shadow.ws / "d").rmdir()
    shadow.write("d", b"a file now\n")
    shadow.check()
    # and back, in one call each
    (shadow.ws / "d").unlink()
    shadow.write("d/a")
    (shadow.ws / "f" / "inside").unlink()
    (shadow.ws / "f").rmdir()
    shadow.write("f")
    shadow.check()


def test_symbolic_links(shadow: Shadow) -> None:
    shadow.write("target.txt")
    (shadow.ws / "link").symlink_to("target.txt")
    (shadow.ws / "dangling").symlink_to("nowhere")
    shadow.check()
    (shadow.ws / "link").unlink()
    (shadow.ws / "link").symlink_to("elsewhere")  # same kind, another target
    shadow.check()
    (shadow.ws / "dangling").unlink()
    shadow.write("dangling", b"a file now\n")  # a link becomes a file
    (shadow.ws / "target.txt").unlink()
    (shadow.ws / "target.txt").symlink_to("dangling")  # and a file a link
    shadow.check()


def test_a_folder_replaced_by_a_link_to_a_folder_with_the_same_names(shadow: Shadow) -> None:
    shadow.write("d/f", b"one\n")
    shadow.write("real/f", b"two\n")
    shadow.check()
    (shadow.ws / "d" / "f").unlink()
    (shadow.ws / "d").rmdir()
    (shadow.ws / "d").symlink_to("real")  # d/f is there through the link: beyond it, not a file
    shadow.check()


def test_a_change_of_the_same_size_within_the_same_second_is_recorded(shadow: Shadow) -> None:
    path = shadow.write("racy.txt", b"aaaa\n")
    shadow.write("other.txt")
    shadow.check()
    st = path.stat()
    path.write_bytes(b"bbbb\n")  # same size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same mtime
    shadow.check()
    # and once the index is older than the file: only its ctime says so
    time.sleep(1.1)
    shadow.write("later.txt")
    shadow.check()
    st = path.stat()
    path.write_bytes(b"cccc\n")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    shadow.check()


def test_many_records_within_one_second_see_each_new_file(shadow: Shadow) -> None:
    """The untracked cache trusts a folder's stat data: within the second it was read, git reads
    the folder again (racy), which this checks."""
    shadow.write("d/e/first")
    shadow.check()
    for n in range(15):
        shadow.write(f"d/e/new-{n}")
        if n % 3 == 0:
            (shadow.ws / f"d/e/new-{n - 1}").unlink(missing_ok=True)
        if n % 4 == 1:
            shadow.write(f"d/e/folder-{n}/deeper/file")  # folders new within the second too
        shadow.check()


def test_the_executable_bit(shadow: Shadow) -> None:
    path = shadow.write("run.sh", b"#!/bin/sh\n")
    shadow.check()
    path.chmod(0o755)
    executable = shadow.check()
    path.chmod(0o644)
    assert shadow.check() != executable


@pytest.mark.parametrize(
    "name",
    [
        b"with space.txt",
        b"new\nline.txt",
        b"not-utf8-\xff\xfe.txt",
        b":colon-first",
        b":(literal)magic",
        b"*star-first",
        b"*",
        b"?",
        b"[ab]",
        b"back\\slash",
        b'"quoted"',
        b"-dash-first",
        b"tab\there",
        b"d i r/:(exclude)x/*.txt",
        "unicodé-名前.txt".encode(),
    ],
)
def test_odd_names(shadow: Shadow, name: bytes) -> None:
    shadow.write("plain.txt")
    shadow.write(b"a")
    shadow.write(b"ab")
    shadow.check()
    path = shadow.write(name, b"one\n")
    shadow.check()
    path.write_bytes(b"two, longer\n")
    shadow.check()
    path.unlink()
    shadow.check()


def test_ignored_files_and_one_ignored_no_more(shadow: Shadow) -> None:
    shadow.write(".gitignore", b"*.log\nbuild/\n")
    shadow.write("kept.txt")
    shadow.write("tracked.tmp")
    shadow.check()
    shadow.write("x.log")
    shadow.write("build/out.o")
    shadow.write("sub/y.log")
    shadow.write("sub/.gitignore", b"!y.log\n")  # un-ignored below
    shadow.check()
    shadow.write(".gitignore", b"build/\n*.tmp\n")  # x.log un-ignored; a tracked file ignored stays
    shadow.write("tracked.tmp", b"changed\n")
    shadow.check(fresh=False)
    (shadow.ws / "tracked.tmp").unlink()
    shadow.check()
    shadow.write("tracked.tmp", b"again, ignored now\n")
    shadow.check()
    (shadow.ws / ".gitignore").unlink()
    shadow.check()


def test_a_nested_git_repository(shadow: Shadow) -> None:
    shadow.write("top.txt")
    shadow.check()
    nested = shadow.ws / "vendor" / "lib"
    nested.mkdir(parents=True)
    env = {**os.environ, **_ENV, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@t"

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=nested, env=env, check=True, capture_output=True)

    git("init", "-q")
    (nested / "inner.txt").write_text("inner\n")
    git("add", "-A")
    git("commit", "-q", "-m", "one")
    shadow.check()  # the commit, as a gitlink
    (nested / "inner.txt").write_text("dirty, not committed\n")
    shadow.write("vendor/lib/untracked.txt")
    shadow.check()  # the same gitlink: its files are its own
    git("commit", "-q", "-am", "two")
    shadow.check()  # its new commit
    # a .gitmodules that tells git to ignore it: ``git add`` records its commit all the same
    shadow.write(".gitmodules", b'[submodule "lib"]\n\tpath = vendor/lib\n\turl = ./lib\n\tignore = all\n')
    shadow.check()
    git("commit", "-q", "--allow-empty", "-m", "three")
    shadow.check()
    # its .git gone, its files left: git keeps the gitlink as it was, and reads none of them
    subprocess.run(["rm", "-rf", str(nested / ".git")], check=True)
    shadow.check(fresh=False)
    subprocess.run(["rm", "-rf", str(shadow.ws / "vendor")], check=True)
    shadow.check()


def test_a_nested_repository_without_a_commit_fails_as_git_add_does(shadow: Shadow) -> None:
    shadow.write("top.txt")
    shadow.check()
    nested = shadow.ws / "empty-repo"
    nested.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=nested, env={**os.environ, **_ENV}, check=True)
    (nested / "file").write_text("x\n")
    with pytest.raises(subprocess.CalledProcessError):
        plain_tree(shadow.ws, shadow.tmp / "scratch")
    with pytest.raises(WorkspaceTreeError, match="does not have a commit"):
        shadow.record()
    subprocess.run(["rm", "-rf", str(nested)], check=True)
    shadow.record()  # recovers: the whole way once (HEAD was dropped), then the short one
    shadow.check()


def test_files_past_the_size_bounds_are_left_out_then_taken_back(tmp_path: Path) -> None:
    shadow = Shadow(tmp_path, max_file_bytes=1000, max_total_bytes=5000)
    shadow.write("small.txt", b"s" * 100)
    shadow.write("grows.txt", b"g" * 100)
    shadow.check()
    shadow.write("big.bin", b"b" * 2000)
    shadow.check(left_out=("big.bin",))
    shadow.write("other.txt")  # the big file is new again at each record, and still left out
    shadow.check(left_out=("big.bin",))
    shadow.write("grows.txt", b"g" * 1500)  # a tracked file that grows past the bound goes
    shadow.check(left_out=("big.bin", "grows.txt"))
    shadow.write("big.bin", b"b" * 10)  # shrunk back in
    shadow.check(left_out=("grows.txt",))
    shadow.write("grows.txt", b"g" * 10)
    shadow.check()
    # together past max_total_bytes: the largest go first
    for n in range(7):
        shadow.write(f"many/{n}.txt", bytes([65 + n]) * (900 - n))
    left = ("many/0.txt", "many/1.txt")
    shadow.check(left_out=left)
    for n in range(7):
        (shadow.ws / f"many/{n}.txt").unlink()
    shadow.check()


def test_many_files_changed_at_once(shadow: Shadow) -> None:
    for n in range(2000):
        shadow.write(f"d{n % 17}/f{n}.txt", f"{n}\n".encode())
    shadow.check()
    for n in range(0, 2000, 2):
        shadow.write(f"d{n % 17}/f{n}.txt", f"{n} changed\n".encode())
    for n in range(1, 2000, 4):
        (shadow.ws / f"d{n % 17}/f{n}.txt").unlink()
    for n in range(1500):
        shadow.write(f"new/{n % 30}/g{n}.txt", f"new {n}\n".encode())
    shadow.check()


def test_line_endings_and_attributes_as_git_add(shadow: Shadow) -> None:
    shadow.write(".gitattributes", b"*.txt text\n*.bin binary\n")
    shadow.write("crlf.txt", b"a\r\nb\r\n")
    shadow.write("data.bin", b"a\r\nb\r\n")
    shadow.check()
    shadow.write("crlf.txt", b"c\r\nd\r\n")
    shadow.check()


def test_a_shadow_from_before_head_and_the_settings_catches_up(shadow: Shadow) -> None:
    shadow.write("a.txt")
    shadow.check()
    git_dir = shadow.repo.git_dir
    (git_dir / "HEAD").write_text("ref: refs/heads/master\n")  # as ``git init`` left it
    (git_dir / _SETTINGS_FILE).unlink()
    shadow.repo.git("config", "--unset", "status.showUntrackedFiles")
    shadow.write("b.txt")
    shadow.check()
    assert shadow.repo.git("config", "status.showUntrackedFiles").strip() == b"all"
    assert (git_dir / _SETTINGS_FILE).exists()


def test_a_head_that_does_not_read_takes_the_whole_way_once(shadow: Shadow) -> None:
    shadow.write("a.txt")
    shadow.check()
    head = (shadow.repo.git_dir / "HEAD").read_text().strip()
    loose = shadow.repo.git_dir / "objects" / head[:2] / head[2:]
    loose.chmod(0o644)
    loose.write_bytes(zlib.compress(b"blob 3\0abc"))  # a crash left it damaged
    shadow.write("b.txt")
    before = shadow.whole
    assert shadow.record().tree == plain_tree(shadow.ws, shadow.tmp / "scratch")
    assert shadow.whole == before + 1
    shadow.write("c.txt")
    shadow.check()
    # the same, the tree the same after it: the commit is written again, not trusted
    head = (shadow.repo.git_dir / "HEAD").read_text().strip()
    (shadow.repo.git_dir / "objects" / head[:2] / head[2:]).write_bytes(b"")
    before = shadow.whole
    shadow.record()
    assert shadow.whole == before + 1
    shadow.check()


def test_a_packed_head_and_a_checkout(shadow: Shadow) -> None:
    shadow.write("a.txt", b"one\n")
    first = shadow.check()
    shadow.repo.git("repack", "-a", "-d", "-q")
    shadow.repo.git("prune-packed")
    assert head_tree(shadow.repo.git_dir) is None  # not loose: the tree is written again
    shadow.write("b.txt")
    shadow.check()
    shadow.repo.checkout(first)
    assert not (shadow.ws / "b.txt").exists()
    assert shadow.check() == first
    shadow.write("a.txt", b"two\n")
    shadow.check()


def test_status_lines_it_does_not_expect_take_the_whole_way() -> None:
    assert changes_of(b"2 R. N... 100644 100644 100644 a b R100 new\0old\0") is None
    assert changes_of(b"u UU N... 1 2 3 4 a b c path\0") is None
    found = changes_of(
        b"1 .M N... 100644 100644 100644 a b with space\0? new\nline\0" + b"1 .D N... 1 2 3 a b gone\0"
    )
    assert found is not None
    assert found.paths == [b"with space", b"new\nline", b"gone"]
    assert found.tracked == {b"with space", b"gone"} and found.deleted == [b"gone"]
    assert not found.staged
    staged = changes_of(b"1 A. N... 000000 100644 100644 a b added\0")
    assert staged is not None and staged.staged and not staged.paths


def test_too_large_skips_nested_repositories_and_gone_files(tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(b"x" * 20)
    (tmp_path / "repo").mkdir()
    assert too_large(tmp_path, [b"big", b"repo/", b"gone", b""], 10, 100) == ["big"]


def test_the_objects_since_a_tree_read_from_loose_objects_are_git_diff_trees(
    shadow: Shadow, monkeypatch: pytest.MonkeyPatch
) -> None:
    trees = [shadow.check()]
    shadow.write("a/b/c.txt")
    shadow.write("a/d.txt")
    shadow.write("top.txt")
    trees.append(shadow.check())
    shadow.write("a/b/c.txt", b"changed\n")
    (shadow.ws / "top.txt").chmod(0o755)
    shadow.write("new/deep/er/file.txt")
    trees.append(shadow.check())
    (shadow.ws / "a/d.txt").unlink()
    shadow.write("a/d.txt/now-a-folder.txt")
    (shadow.ws / "link").symlink_to("top.txt")
    trees.append(shadow.check())
    nested = shadow.ws / "sub"
    nested.mkdir()
    env = {**os.environ, **_ENV, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    subprocess.run(["git", "init", "-q"], cwd=nested, env=env, check=True)
    subprocess.run(["git", "commit", "-q", "--allow-empty", "-m", "x"], cwd=nested, env=env, check=True)
    trees.append(shadow.check())
    pairs = [(new, old) for new in trees for old in trees if new != old]
    loose = {pair: shadow.repo.objects_since(*pair) for pair in pairs}
    assert all(found is not None for found in loose.values())
    monkeypatch.setattr("durable_agent.activities.workspaces.shadow.loose_objects_since", lambda *_: None)
    for pair in pairs:
        assert sorted(loose[pair]) == sorted(shadow.repo.objects_since(*pair)), pair


class CountingSink(FilesystemExportSink):
    """The filesystem sink, its questions counted."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.asked: list[list[str]] = []

    async def missing_objects(self, ids: Sequence[str]) -> list[str]:
        self.asked.append(list(ids))
        return await super().missing_objects(ids)


async def test_a_boundary_asks_the_sink_once_and_sends_again_what_gc_took(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "a" / "b").mkdir(parents=True)
    (ws / "a" / "b" / "one.txt").write_text("one\n")
    (ws / "top.txt").write_text("top\n")
    sink = CountingSink(tmp_path / "sink")
    trees = WorkspaceTrees(WorkspaceCheckpointsConfig(path=tmp_path / "shadows"), {"s": sink})
    repo = trees.repo(ws)

    def held(tree: str) -> bool:
        objects = repo.objects_since(tree, None)
        return all(sink.object_path(oid).exists() for oid in objects)

    first = await trees.record(ws, "s", strict=True)
    assert first is not None and held(first.tree)
    sink.asked.clear()
    (ws / "a" / "b" / "one.txt").write_text("changed\n")
    second = await trees.record(ws, "s", strict=True)
    assert second is not None and held(second.tree)
    # one question: the new tree, a, a/b, the file, and the tree sent before
    assert [sorted(ids) for ids in sink.asked] == [
        sorted([*repo.objects_since(second.tree, first.tree), first.tree])
    ]
    assert len(sink.asked[0]) == 5
    # nothing changed: nothing asked
    sink.asked.clear()
    assert await trees.record(ws, "s", strict=True) == second
    assert sink.asked == []
    # ``gc`` took every object: the next boundary sends the whole tree again
    shutil.rmtree(tmp_path / "sink" / "~objects")
    (ws / "top.txt").write_text("top, changed\n")
    third = await trees.record(ws, "s", strict=True)
    assert third is not None and held(third.tree)
    assert len(sink.asked) == 2 and second.tree in sink.asked[0]
