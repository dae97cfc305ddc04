"""v100lab: why llama.cpp is slow on your GPU, and what makes it fast — with numbers.

The package is layered so that nothing imports upward:

* data and config: ``errors``, ``devices``, ``config``, ``results``, ``loadlog``, ``quantmix``
* model facts: ``header`` (GGUF header → ``ModelSpec``), ``zoo`` (models on disk)
* predictions: ``memory``, ``speed``
* measurements: ``bench`` and ``backends``
* the workbook: ``levers``, ``advisor``, ``plots``, ``scenario``, ``workbook``
* the ``v100lab`` command: ``cli`` and ``commands``
"""

__version__ = "0.1.0"
