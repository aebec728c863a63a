"""The Textual TUI (`speclocal` with no subcommand). Importing this package loads neither Textual nor
llama.cpp; `main.run_tui` does, when it is called.

Modules: `app` (the App: layout, keys), `loading` and `generation` (its two mixins: models in, prompts
run), `backend` (the engine adapter the App is written against; the real engine runs in a process of its
own, `speclocal.engine_process`), `testing` (a scripted backend for tests), `history` (live numbers, history
rows, export), `config` (the settings file), `screens`, `widgets`, `messages`, `compositor` (cheaper partial redraws),
`probe` (RAM), `terminal` (nothing else writes to the terminal), `main` (the entry point), `bench` (does
drawing slow decoding?).
"""
