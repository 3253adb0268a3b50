"""The blocking SDK's listener dispatcher thread dies when the session is busy (pymq/client/blocking.py,
Session._dispatch_loop: `with self._guard:` raises IllegalStateError out of the thread's loop), and every
later message for the listener waits forever.  Using a listener's session from another thread is JMS
misuse, but the failure should be loud (or the dispatcher should wait its turn), not a silent stall."""
import threading
import uuid

import pymq
from tests.conftest import wait_for


def test_listener_keeps_working_after_the_session_was_busy(broker):
    with pymq.connect(broker.url) as conn:
        s = conn.create_session()
        a, b = pymq.Queue(f"a-{uuid.uuid4().hex[:6]}"), pymq.Queue(f"b-{uuid.uuid4().hex[:6]}")
        got = []
        s.create_consumer(a).set_message_listener(lambda m: got.append(m.text))
        other = s.create_consumer(b)
        p = conn.create_session().create_producer(a)
        woke = []
        busy = threading.Thread(target=lambda: woke.append(other.receive(10.0)))
        busy.start()
        assert wait_for(lambda: s._guard._owner == busy.ident)        # the other thread is inside the session
        p.send("during")            # arrives while the other thread is inside the session
        # then wake that thread: the broker sent "during" on this connection before this one
        conn.create_session().create_producer(b).send("wake")
        busy.join(10)
        assert [m.text for m in woke] == ["wake"]
        p.send("after")
        assert wait_for(lambda: len(got) == 2), got
        assert got == ["during", "after"]           # each once
