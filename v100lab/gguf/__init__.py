"""The model as llama.cpp sees it: the bounded GGUF header reader, skeletons, llama.cpp's context arithmetic."""
