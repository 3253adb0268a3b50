"""A node's links and their HA epochs (spec/ha.md §5): the driver's side of the epoch rule.

A peer's link logs in with ``pymq-node-epoch`` (0 for a node without backups); the cluster's state keeps
the highest epoch each node id has shown and says whether a link's epoch is still admitted. This part
remembers which session is which peer's link at which epoch, refuses a CONNECT, forward or control frame of
a lower epoch (ClusterError, reason ``stale-epoch``) and aborts a former process's links when its node id
is taken over.
"""
from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

from pymq.errors import ClusterError
from pymq.protocol.numbers import header_int
from pymq_server.cluster.actions import Action
from pymq_server.cluster.state import ClusterState


class LinkEpochs:
    def __init__(self, state: ClusterState) -> None:
        self.state = state
        #: peers' sessions here (their links), with the epoch each connected at
        self.inbound: weakref.WeakKeyDictionary[Any, tuple[str, int]] = weakref.WeakKeyDictionary()

    def admitted(self, session: Any, headers: Mapping[str, str]) -> list[Action]:
        """A peer's link logged in: its actions (a higher epoch replaces the former process), or ClusterError
        when its node id has shown a higher epoch."""
        peer = session.user.name.split(":", 1)[-1]
        epoch = header_int(headers, "pymq-node-epoch", 0)
        admitted, actions = self.state.link_opened(peer, epoch)
        if not admitted:
            raise self._stale(peer, epoch)
        self.inbound[session] = (peer, epoch)
        return actions

    def check(self, session: Any) -> None:
        """A frame on a peer's link: refused (the link aborted) when its epoch is no longer admitted. (Per
        forwarded message: in a cluster where no node id has shown an epoch, every link is at its node's
        highest, 0, and nothing is looked up.)"""
        if not self.state.epochs_shown:
            return
        seen = self.inbound.get(session)
        if seen is not None and not self.state.admits(*seen):
            self.refuse(session)
            raise self._stale(*seen)

    def replaced(self, peer: str, epoch: int) -> None:
        """``peer`` is held at ``epoch`` now: its links here of a lower epoch are aborted."""
        for session, (node, at) in list(self.inbound.items()):
            if node == peer and at < epoch:
                self.refuse(session)

    @staticmethod
    def refuse(session: Any) -> None:
        link = getattr(session, "link", None)
        if link is not None:
            getattr(link, "abort", link.close)()

    def _stale(self, peer: str, epoch: int) -> ClusterError:
        return ClusterError(f"cluster node {peer} at epoch {epoch} was taken over (epoch "
                            f"{self.state.epochs.get(peer, 0)}): refused", reason="stale-epoch", node=peer)
