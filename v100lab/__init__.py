"""v100lab: why llama.cpp is slow on your GPU, and what makes it fast — with numbers.

The package is in layer folders, bottom to top: ``base`` (errors, safe I/O, clocks, build flags) < ``facts``
(immutable data and the tidy table) < ``gguf`` (the model as llama.cpp sees it) < ``models`` (models on disk)
< ``predict`` (memory, work, rates, speed, serving) < ``measure`` (llama.cpp run and measured) < ``advise``
(tune, the doctor, the seed judged) < ``workbook`` (scenarios, plots, the notebooks' levers, the runner) <
``cli`` (the ``v100lab`` command). A module imports only downwards; ARCHITECTURE.md is the map, and
``[tool.importlinter]`` in pyproject.toml the contract (checked by tests/test_layers.py).
"""

__version__ = "0.1.0"
