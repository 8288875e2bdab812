"""``torchrun [...] -m gpuopt.dist SPEC.json``: one rank of a distributed benchmark (:func:`gpuopt.dist.worker.main`).

An entry module of its own, which the package does not import: ``-m gpuopt.dist.worker`` would run a
module that ``gpuopt.dist`` already imported (runpy's RuntimeWarning on every rank)."""

import sys

from .worker import main

sys.exit(main())
