"""``filled_images``' memo: a long run's boundary looks its messages up instead of searching them,
reads each image from the store once, and forgets what a replaced log no longer holds."""

from __future__ import annotations

import base64
import hashlib

from durable_agent.activities.staging import filled_images, stage_images
from durable_agent.activities.store.memory import MemorySessionStore
from durable_agent.core.models import ImageBlock, Message, TextBlock, ToolResultBlock


class CountingStore(MemorySessionStore):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def staged_text(self, run_id: str, digest: str) -> str | None:
        self.reads += 1
        return await super().staged_text(run_id, digest)


def plain(text: str) -> Message:
    return Message(role="user", content=(TextBlock(text=text),))


async def image_message(store: MemorySessionStore) -> Message:
    data = base64.b64encode(b"\x89PNG not really").decode("ascii")
    image = ImageBlock(
        media_type="image/png",
        data=data,
        digest="sha256:" + hashlib.sha256(data.encode()).hexdigest(),
        size=15,
    )
    (reference,) = await stage_images(store, "r", (image,))
    return Message(role="user", content=(ToolResultBlock(tool_use_id="c", content="", images=(reference,)),))


async def test_the_whole_log_is_remembered_and_each_image_read_once() -> None:
    store = CountingStore()
    log = [plain("a"), await image_message(store), plain("b")]
    memo: dict[int, tuple[Message, Message]] = {}
    first = await filled_images(store, "r", log, memo, whole_log=True)
    assert first[0] is log[0] and first[2] is log[2]
    assert first[1].images()[0].data and not log[1].images()[0].data
    assert store.reads == 1 and set(memo) == {id(m) for m in log}

    again = await filled_images(store, "r", [*log, plain("c")], memo, whole_log=True)
    assert again[1] is first[1]  # the same object: an export's encoder knows it
    assert store.reads == 1 and len(memo) == 4


async def test_a_models_view_adds_no_plain_messages_to_the_memo() -> None:
    store = CountingStore()
    log = [plain("a"), await image_message(store)]
    memo: dict[int, tuple[Message, Message]] = {}
    await filled_images(store, "r", log, memo, whole_log=True)
    for _ in range(3):  # a view's messages may be new objects at every call
        view = [plain("summary"), *log]
        shown = await filled_images(store, "r", view, memo)
        assert shown[2].images()[0].data
    assert len(memo) == 2 and store.reads == 1


async def test_a_replaced_log_s_messages_are_forgotten() -> None:
    store = CountingStore()
    memo: dict[int, tuple[Message, Message]] = {}
    await filled_images(store, "r", [plain(str(i)) for i in range(80)], memo, whole_log=True)
    assert len(memo) == 80
    rewound = [plain("x"), await image_message(store)]
    await filled_images(store, "r", rewound, memo, whole_log=True)
    assert set(memo) == {id(m) for m in rewound}
