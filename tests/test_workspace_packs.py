"""Objects from a sink kept in a shadow repository as one pack (``activities/workspaces/packs.py``)."""

from __future__ import annotations

import hashlib
import zlib
from pathlib import Path

import pytest

from durable_agent.activities.workspaces.errors import WorkspaceTreeError
from durable_agent.activities.workspaces.packs import pack_of
from durable_agent.activities.workspaces.shadow import ShadowRepo


def loose(kind: bytes, body: bytes) -> tuple[str, bytes]:
    raw = kind + b" " + str(len(body)).encode() + b"\0" + body
    return hashlib.sha1(raw).hexdigest(), zlib.compress(raw)


def shadow(tmp_path: Path) -> ShadowRepo:
    (tmp_path / "ws").mkdir()
    repo = ShadowRepo(tmp_path / "shadow", tmp_path / "ws")
    repo.prepare()
    return repo


def test_many_objects_become_one_pack_and_read_back_as_they_were(tmp_path: Path) -> None:
    # sizes around the header's byte boundaries (15, 2047, 2**18), an empty body, a binary one
    bodies = [b"", b"x" * 15, b"y" * 16, b"z" * 2047, b"\0\1\2" * 700, b"w" * 2**18]
    bodies += [f"file {i}\n".encode() * (i + 1) for i in range(90)]
    objects = dict(loose(b"blob", body) for body in bodies)
    repo = shadow(tmp_path)
    repo.add_objects(objects)
    assert list((repo.git_dir / "objects" / "pack").glob("*.pack"))
    assert not [p for p in (repo.git_dir / "objects").glob("??/*")], "written loose"
    read = repo.read(list(objects))
    assert {oid: body for oid, (_, body) in read.items()} == {
        oid: zlib.decompress(data).partition(b"\0")[2] for oid, data in objects.items()
    }
    assert repo.loose(list(objects)).keys() == objects.keys()


def test_a_few_objects_stay_loose_and_a_wrong_one_is_refused_either_way(tmp_path: Path) -> None:
    repo = shadow(tmp_path)
    few = dict(loose(b"blob", f"{i}".encode()) for i in range(3))
    repo.add_objects(few)
    assert repo.has(list(few)) == set(few)
    many = dict(loose(b"blob", f"again {i}".encode()) for i in range(100))
    oid = next(iter(many))
    for given in ({oid: loose(b"blob", b"not it")[1]}, {**many, oid: loose(b"blob", b"not it")[1]}):
        with pytest.raises(WorkspaceTreeError, match="is not that object"):
            repo.add_objects(given)


def test_a_pack_is_what_git_reads() -> None:
    pack = pack_of([(b"blob", b"hello\n")])
    assert pack[:4] == b"PACK" and pack[4:12] == b"\0\0\0\2\0\0\0\1"
    assert hashlib.sha1(pack[:-20]).digest() == pack[-20:]
