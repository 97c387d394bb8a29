"""Clients of OpenAI-compatible servers (the HTTP benchmark client of mode=bench)."""
