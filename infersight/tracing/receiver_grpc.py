"""The OTLP trace receiver's gRPC listener (tracing.receiver): the TraceService/Export method on
HOST:PORT, each request's raw bytes handed to the receiver's one export path, which parses, counts
and answers them; a body it refuses ends the call with INVALID_ARGUMENT, or RESOURCE_EXHAUSTED when
too large. grpcio is optional (infersight[grpc]): it is imported only when this listener is built.
"""
from __future__ import annotations

from typing import Callable

from infersight.tracing import otlp_decode as D
from infersight.tracing.daemon_executor import DaemonThreadExecutor
from infersight.tracing.receiver_address import ReceiverConfigError

GRPC_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"


class GrpcListener:
    """export: the receiver's path for one protobuf body (OtlpDecodeError when refused); bodies up to
    twice max_body_bytes reach it. Bound when built (ReceiverConfigError when it cannot be, or
    without grpcio); `port` is the port bound."""

    def __init__(self, export: Callable[[bytes], D.DecodedSpans], host: str, port: int,
                 max_body_bytes: int) -> None:
        try:
            import grpc
        except ImportError:
            raise ReceiverConfigError("the OTLP gRPC receiver needs grpcio: pip install 'infersight[grpc]'") from None
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

        def handle(body: bytes, context: "grpc.ServicerContext") -> ExportTraceServiceResponse:
            try:
                return export(body).response()
            except D.BodyTooLarge as exc:
                context.set_code(grpc.StatusCode.RESOURCE_EXHAUSTED)
                context.set_details(str(exc))
            except D.OtlpDecodeError as exc:
                context.set_code(grpc.StatusCode.INVALID_ARGUMENT)
                context.set_details(str(exc))
            return ExportTraceServiceResponse()

        # Bodies up to twice our limit reach the handler, so the ones over it are counted there; beyond
        # that gRPC itself refuses them (RESOURCE_EXHAUSTED, uncounted). No SO_REUSEPORT: a busy port fails.
        # Daemon workers: a handler stuck in the sink cannot hold the agent's exit (daemon_executor.py).
        self.pool = DaemonThreadExecutor(max_workers=2, thread_name_prefix="infersight-otlp-grpc")
        server = grpc.server(self.pool,
                             options=[("grpc.so_reuseport", 0),
                                      ("grpc.max_receive_message_length", 2 * max_body_bytes)])
        handler = grpc.unary_unary_rpc_method_handler(  # raw bytes in: we parse, so we count what does not
            handle, request_deserializer=None, response_serializer=ExportTraceServiceResponse.SerializeToString)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(GRPC_SERVICE, {"Export": handler}),))
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            bound = server.add_insecure_port(address)
        except RuntimeError:
            bound = 0
        if not bound:
            raise ReceiverConfigError(f"cannot listen for OTLP/gRPC on {address} (in use?); "
                                      "pick another with --otlp-receiver-grpc HOST:PORT")
        self.server, self.port = server, bound

    def start(self) -> None:
        self.server.start()

    def stop(self) -> None:
        """Calls still running after a 1 s grace are cancelled; their threads are daemons, abandoned if
        stuck."""
        self.server.stop(grace=1).wait(5)
        self.pool.shutdown(wait=False, cancel_futures=True)
