"""vm:// over the connection limit: EmbeddedBroker.open_link's start() (server/embedded.py, server/net/vm.py) lets
broker.session_opened's PymqError escape into the broker loop ("Exception in callback"), so the blocking
client waits its whole timeout and gets TimeoutError instead of the ResourceLimit a TCP client gets at once."""
import uuid

import pytest

import pymq
from pymq.errors import ResourceLimit
from pymq_server.embedded import embedded_broker, stop_embedded


def test_vm_connection_limit_is_refused_with_resource_limit():
    name = f"lim-{uuid.uuid4().hex[:6]}"
    embedded_broker(name).server.broker.config.max_connections = 1
    try:
        with pymq.connect(f"vm://{name}"):
            with pytest.raises(ResourceLimit):
                pymq.connect(f"vm://{name}", timeout=3)
    finally:
        stop_embedded(name)
