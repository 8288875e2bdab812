"""Serving experiments: gpuopt's C++ dynamic batcher as an in-process server, driven by a C++ load
generator with MLPerf LoadGen's scenarios; the seeds' naive Python batcher as a baseline; searches for
the highest rate under a latency SLO and for the latency-throughput curve."""

from . import cells  # noqa: F401  (registers the sweep spec's serve: section)
from .api import BATCHERS, RateSearch, build, latency_curve, max_rate, serve
from .load import ARRIVALS, SCENARIOS, LoadSpec, ServeResult, read_trace
from .naive import NaiveBatcher
from .server import Future, QueueFullError, RequestFailed, Server, graph_batch_sizes

__all__ = ["ARRIVALS", "BATCHERS", "SCENARIOS", "Future", "LoadSpec", "NaiveBatcher", "QueueFullError",
           "RateSearch", "RequestFailed", "ServeResult", "Server", "build", "graph_batch_sizes", "latency_curve",
           "max_rate", "read_trace", "serve"]
