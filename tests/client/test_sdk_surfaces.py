"""The blocking SDK (:mod:`pymq`) and the asyncio SDK (:mod:`pymq.aio`) offer the same API (issue 9 item 5).

Both are shells over one client core (:mod:`pymq.client._core`); what a user sees must not drift apart
either.  Compared here, class by class: the public names (methods, properties, instance attributes), each
method's parameters (names, kinds, defaults, annotations with the SDK's class names swapped) and return
annotation, and that every public method has a docstring.  The one allowed difference is ``await``: in
``pymq.aio`` a method is a coroutine unless it is listed in :data:`PLAIN_IN_AIO` (it never waits for
the broker), and ``with``/``for`` become ``async with``/``async for``.

Also the seam to the broker package: importing the SDKs does not load ``pymq_server``, and vm:// finds
the broker through the entry point the broker registers.
"""
from __future__ import annotations

import asyncio
import inspect
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import pymq
import pymq.aio
from pymq_server.embedded import stop_embedded

ROOT = Path(__file__).resolve().parents[2]

#: blocking class -> its asyncio twin
TWINS: dict[type, type] = {
    pymq.ConnectionFactory: pymq.aio.AsyncConnectionFactory,
    pymq.Connection: pymq.aio.AsyncConnection,
    pymq.Session: pymq.aio.AsyncSession,
    pymq.MessageProducer: pymq.aio.AsyncMessageProducer,
    pymq.MessageConsumer: pymq.aio.AsyncMessageConsumer,
    pymq.QueueBrowser: pymq.aio.AsyncQueueBrowser,
    pymq.Requestor: pymq.aio.AsyncRequestor,
    pymq.QueueManager: pymq.aio.AsyncQueueManager,
}

#: the aio methods that are plain calls: they build a value or local state and never wait for the broker
#: (documented in pymq/aio/__init__.py); every other public method of pymq.aio is a coroutine
PLAIN_IN_AIO = {
    "AsyncConnection": {"create_session", "queue_manager", "set_transport_listener"},
    "AsyncSession": {"create_producer", "create_browser", "create_temporary_queue", "create_temporary_topic",
                     "create_topic",
                     "create_message", "create_text_message", "create_bytes_message", "create_map_message"},
    "AsyncMessageConsumer": {"set_message_listener"},
}

#: the protocol methods each side has in place of the other's
SYNC_ONLY = {"__enter__", "__exit__", "__iter__", "__next__"}
ASYNC_ONLY = {"__aenter__", "__aexit__", "__aiter__", "__anext__"}
PROTOCOLS = {"__enter__": "__aenter__", "__exit__": "__aexit__", "__iter__": "__aiter__", "__next__": "__anext__"}

#: constructors users call themselves (the others are made by factory methods, with SDK-specific plumbing)
PUBLIC_CONSTRUCTORS = {pymq.ConnectionFactory, pymq.Requestor}


def _public(cls: type) -> set[str]:
    return {name for name in dir(cls)
            if not name.startswith("_") or name in SYNC_ONLY | ASYNC_ONLY} - set(dir(object))


def _swap_names(annotation: object) -> str:
    """An annotation of the blocking SDK written with the asyncio SDK's class names."""
    text = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
    for sync, aio in TWINS.items():
        text = re.sub(rf"\b{sync.__name__}\b", aio.__name__, text)
    return text


def _shape(signature: inspect.Signature, swap: bool) -> list[tuple[str, object, object, str]]:
    fix = _swap_names if swap else (lambda a: a if isinstance(a, str) else inspect.formatannotation(a))
    return [(p.name, p.kind, p.default, fix(p.annotation)) for p in signature.parameters.values()]


@pytest.mark.parametrize("sync_cls", list(TWINS), ids=lambda c: c.__name__)
def test_both_sdks_have_the_same_methods_and_signatures(sync_cls):
    aio_cls = TWINS[sync_cls]
    sync_names, aio_names = _public(sync_cls), _public(aio_cls)
    # the same names, once ``with``/``for`` are mapped to ``async with``/``async for``
    mapped = {PROTOCOLS.get(name, name) for name in sync_names}
    missing = mapped - aio_names
    extra = aio_names - mapped - {"__anext__"}
    assert not missing, f"{aio_cls.__name__} lacks {sorted(missing)} of {sync_cls.__name__}"
    assert not extra, f"{aio_cls.__name__} has {sorted(extra)} that {sync_cls.__name__} lacks"
    plain = PLAIN_IN_AIO.get(aio_cls.__name__, set())
    for name in sorted(sync_names - SYNC_ONLY):
        sync_attr, aio_attr = inspect.getattr_static(sync_cls, name), inspect.getattr_static(aio_cls, name)
        if isinstance(sync_attr, property) or isinstance(aio_attr, property):
            assert isinstance(sync_attr, property) and isinstance(aio_attr, property), name
            assert (sync_attr.fset is None) == (aio_attr.fset is None), f"{name}: settable in one SDK only"
            assert _swap_names(inspect.signature(sync_attr.fget).return_annotation) == \
                inspect.signature(aio_attr.fget).return_annotation, name
            continue
        sync_fn, aio_fn = getattr(sync_cls, name), getattr(aio_cls, name)
        assert callable(sync_fn) and callable(aio_fn), name
        sync_sig, aio_sig = inspect.signature(sync_fn), inspect.signature(aio_fn)
        where = f"{sync_cls.__name__}.{name}{sync_sig} vs {aio_cls.__name__}.{name}{aio_sig}"
        assert _shape(sync_sig, swap=True) == _shape(aio_sig, swap=False), where
        assert _swap_names(sync_sig.return_annotation) == aio_sig.return_annotation, where
        assert inspect.iscoroutinefunction(aio_fn) is (name not in plain), \
            f"{aio_cls.__name__}.{name} must {'not ' if name in plain else ''}be a coroutine (PLAIN_IN_AIO)"
        assert not inspect.iscoroutinefunction(sync_fn), name
        assert sync_fn.__doc__ and aio_fn.__doc__, f"{name} has no docstring in one SDK"
    if sync_cls in PUBLIC_CONSTRUCTORS:
        assert _shape(inspect.signature(sync_cls.__init__), swap=True) == \
            _shape(inspect.signature(aio_cls.__init__), swap=False)


def test_every_plain_aio_method_is_listed_for_a_reason():
    """PLAIN_IN_AIO names only methods that exist (a stale entry would hide a missing coroutine)."""
    by_name = {cls.__name__: cls for cls in TWINS.values()}
    for cls_name, names in PLAIN_IN_AIO.items():
        for name in names:
            assert callable(getattr(by_name[cls_name], name)), f"{cls_name}.{name}"


@pytest.mark.parametrize("name", ["connect", "reply"])
def test_module_functions_match(name):
    sync_fn, aio_fn = getattr(pymq, name), getattr(pymq.aio, name)
    assert _shape(inspect.signature(sync_fn), swap=True) == _shape(inspect.signature(aio_fn), swap=False)
    assert sync_fn.__doc__ and aio_fn.__doc__


def test_pymq_aio_exports_a_twin_of_every_sdk_name():
    """What ``pymq`` exports for the SDK (not the shared messages, destinations and errors, which
    ``pymq.aio`` users import from ``pymq``) has its counterpart in ``pymq.aio.__all__``."""
    shared = {"Destination", "Queue", "Topic", "TemporaryQueue", "TemporaryTopic", "Message", "TextMessage",
              "BytesMessage", "MapMessage", "PERSISTENT", "NON_PERSISTENT", "PymqError"}
    twins = {sync.__name__: aio.__name__ for sync, aio in TWINS.items()}
    for name in set(pymq.__all__) - shared:
        assert twins.get(name, name) in pymq.aio.__all__, name
        assert hasattr(pymq.aio, twins.get(name, name)), name
    for name in ("AckMode", "ConnectionStatus", "RangeResult", "TlsOptions", "AUTO_ACKNOWLEDGE"):
        assert getattr(pymq.aio, name) is getattr(pymq, name)      # one definition, not a copy


def test_live_objects_have_the_same_public_attributes():
    """Instance attributes (``producer.priority``, ``consumer.destination``, ``conn.client_id``...) are
    not in the classes: open one of everything in each SDK and compare."""
    name = f"surface-{uuid.uuid4().hex[:8]}"
    url = f"vm://{name}"

    def attributes(obj: object) -> set[str]:
        return {key for key in vars(obj) if not key.startswith("_")}

    try:
        with pymq.connect(url) as conn:
            session = conn.create_session(ack_mode=pymq.CLIENT_ACKNOWLEDGE)
            queue = session.create_temporary_queue()
            requestor = pymq.Requestor(session, "/queue/surface")
            sync_objects = [conn.factory, conn, session, session.create_producer(queue),
                            session.create_consumer(queue), session.create_browser(queue), requestor,
                            conn.queue_manager()]
            sync_attrs = [attributes(o) for o in sync_objects]
            requestor.close()

        async def aio_side() -> list[set[str]]:
            async with pymq.aio.connect(url) as conn:
                session = conn.create_session(ack_mode=pymq.CLIENT_ACKNOWLEDGE)
                queue = session.create_temporary_queue()
                async with pymq.aio.AsyncRequestor(session, "/queue/surface") as requestor:
                    objects = [conn.factory, conn, session, session.create_producer(queue),
                               await session.create_consumer(queue), session.create_browser(queue), requestor,
                               conn.queue_manager()]
                    return [attributes(o) for o in objects]

        aio_attrs = asyncio.run(aio_side())
    finally:
        stop_embedded(name)
    for sync_obj, sync_names, aio_names in zip(sync_objects, sync_attrs, aio_attrs, strict=True):
        assert sync_names == aio_names, f"{type(sync_obj).__name__}: only blocking {sorted(sync_names - aio_names)}" \
                                        f", only aio {sorted(aio_names - sync_names)}"


# -- the seam to the broker package ----------------------------------------------------------------------
# (that nothing under pymq/ imports pymq_server is tests/broker/test_layers.py's
# test_the_sdk_never_imports_the_broker)

def test_importing_the_sdks_does_not_load_the_server():
    code = ("import sys, pymq, pymq.aio, pymq.client.apptx, pymq.client.vm\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pymq_server', 'server')))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_importing_the_sdks_looks_up_no_entry_point():
    """importlib.metadata (and the 30 modules it brings: email, csv, datetime, ...) is imported at the first
    entry-point look-up (a vm:// URL, a database transaction), not by ``import pymq``: every application that
    imports pymq would carry it (bench/README.md issue 25: bench_handover's owner parsed 5-12 % slower with it)."""
    code = ("import sys, pymq, pymq.aio, pymq.client.apptx, pymq.client.vm, pymq.protocol.scanner\n"
            "print(sorted(m for m in sys.modules if m.startswith(('importlib.metadata', 'email'))))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_vm_urls_reach_the_broker_through_its_entry_point(monkeypatch):
    """The SDK finds the embedded broker only through the entry point the broker's distribution
    registers; without one, vm:// says what is missing (both SDKs) and nothing is started."""
    from pymq.client import vm
    from pymq.errors import ConnectFailed

    assert vm.registered(vm.TRANSPORTS, "vm") is not None        # this install registers it
    monkeypatch.setattr(vm, "registered", lambda group, name: None)
    name = f"unregistered-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ConnectFailed, match="entry point group 'pymq.transports'"):
        pymq.connect(f"vm://{name}")
    async def aio_side() -> None:
        await pymq.aio.connect(f"vm://{name}")

    with pytest.raises(ConnectFailed, match="registers a 'vm' transport"):
        asyncio.run(aio_side())
    from pymq_server import embedded
    assert name not in embedded._brokers
