"""An engine that forwards to OpenAI-compatible servers: vLLM, SGLang, NIM, TGI, llama.cpp."""
