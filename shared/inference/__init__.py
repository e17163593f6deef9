"""The models memflow runs or calls: the dense embedders (embedder.py), e5's tokenizer that counts
what a query costs them (tokenizer.py), the second look at a search's head (reranker.py: Google's multilingual
USE), and the client of an OpenAI-compatible LLM with its budget and fallbacks (llm.py)."""
