"""`speclocal serve`: an OpenAI-compatible local endpoint (chat and text completions, streaming or not) that
speculates per request, only where it pays: `--mode auto` (the default) lets the measured cost model pick
plain, prompt lookup or the draft model before every step, and each request may ask for a mode of its own.

Threads and processes: uvicorn's event loop on the main thread; every engine call on one engine worker thread
(`worker.py`); the engine itself in a process of its own, so a native crash in llama.cpp costs one request (a
500 naming it) and a reload, not the server. Bound to 127.0.0.1 by default; another address needs `--api-key`. SIGTERM stops it (exit 0),
Ctrl-C too (exit 130, as the CLI reports an interrupt); either way running generations stop within one step and
a summary per task type goes to stderr.
"""
