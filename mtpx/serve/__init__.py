"""`mode=serve`: an OpenAI-compatible HTTP server over the engine (mtpx/serve/app.py)."""
