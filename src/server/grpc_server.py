"""Make `fx aggregator start` listen on the plan's `network.settings.agg_addr` only.

OpenFL 1.9's `AggregatorGRPCServer.__init__` hard-codes `self.uri = f"[::]:{agg_port}"`: the aggregator
accepts connections on every interface whatever the plan says. `Plan.get_server` already passes every
`network.settings` key, `agg_addr` included, to the server's constructor (which swallows it in **kwargs), and
`Plan._get_server` looks the class up by name in `openfl.federated.plan.plan` when it builds the server.

The least invasive fix found: a subclass that changes nothing but `self.uri`, put under that name.
`install()` is called by `AuditingAggregator.__init__`, which `Plan.get_server` runs (via `get_aggregator`)
just before `_get_server`, so the plan that loads our aggregator also gets the bound server, with no change
to OpenFL's files, no copied server code, and TLS, interop and request checks untouched. Rejected: a copy of
`Plan.get_server` (duplicates OpenFL code), rewriting the URI inside `create_grpc_server` (string surgery on
every server), `transport_protocol: rest` (another transport).

The subclass also logs every request OpenFL refuses, at WARNING, with the name claimed and the peer address:
OpenFL answers a certificate whose name is not an authorized collaborator UNAUTHENTICATED
(`validate_collaborator`, with TLS) and a header naming an unknown sender with an error (`check_request`,
which every RPC runs after `validate_collaborator`) and logs neither.
"""

from __future__ import annotations

import ipaddress
import logging
import threading

from openfl.transport import AggregatorGRPCServer

from src.process.party_events import emit

logger = logging.getLogger(__name__)


def bind_uri(agg_addr: str, agg_port) -> str:
    """The gRPC listening address for `agg_addr`; IPv6 literals need brackets ("[::1]:50051")."""
    host = str(agg_addr).strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        if ipaddress.ip_address(host).version == 6:
            return f"[{host}]:{agg_port}"
    except ValueError:
        pass  # a host name such as localhost: gRPC resolves it and binds each of its addresses
    return f"{host}:{agg_port}"


class AddressBoundGRPCServer(AggregatorGRPCServer):
    """OpenFL's gRPC server, listening on `agg_addr` instead of on every interface, logging refused requests."""

    def __init__(self, aggregator, agg_port, agg_addr=None, **kwargs):
        super().__init__(aggregator, agg_port, **kwargs)
        if agg_addr:
            self.uri = bind_uri(agg_addr, agg_port)
        self._request = threading.local()  # the peer of the request this gRPC worker thread is serving
        logger.info("Aggregator gRPC server will listen on %s", self.uri)

    def serve(self):
        emit("aggregator", "serving")  # a status event for the tooling (src.process.party_events)
        return super().serve()

    def validate_collaborator(self, request, context):
        self._request.peer = _peer(context)
        try:
            super().validate_collaborator(request, context)
        except Exception:  # context.abort raises a bare Exception once the status (UNAUTHENTICATED) is set
            common_name = _certificate_name(context)
            logger.warning("Refused a request from %r (certificate name %r) at %s: not an authorized collaborator "
                           "(UNAUTHENTICATED)", request.header.sender, common_name, self._request.peer)
            raise

    def check_request(self, request):
        try:
            super().check_request(request)
        except AssertionError as err:
            logger.warning("Refused a request from %r at %s: %s", request.header.sender,
                           getattr(self._request, "peer", "an unknown address"), err)
            raise


def _peer(context) -> str:
    try:
        return context.peer()  # e.g. "ipv4:127.0.0.1:53122", "ipv6:[::1]:53122"
    except Exception:  # noqa: BLE001 - only for the log line
        return "an unknown address"


def _certificate_name(context) -> str | None:
    try:
        names = context.auth_context().get("x509_common_name") or []
        return names[0].decode("utf-8", "replace") if names else None
    except Exception:  # noqa: BLE001 - only for the log line
        return None


def install() -> None:
    """Have `Plan._get_server` build `AddressBoundGRPCServer` (idempotent)."""
    import openfl.federated.plan.plan as plan_module

    if plan_module.AggregatorGRPCServer is not AddressBoundGRPCServer:
        plan_module.AggregatorGRPCServer = AddressBoundGRPCServer
