"""Base: the exception family, bounded reads and atomic writes, UTC stamps, llama.cpp's build flags."""
