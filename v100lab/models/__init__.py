"""Models on disk: the worker process, the cache, synthetic models, the zoo of aliases, resolving a model argument."""
