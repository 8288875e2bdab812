"""gpuopt's pytest plugin (entry point ``gpuopt_pytest``): the ``gpuopt_bench`` fixture, baselines and
regression checks. Split like pytest-benchmark: plugin (options and hooks), fixture, session (state
and summary), baselines (storage), regression (statistics of a check).

Layer: the top, beside the CLI; imports anything below.
"""
