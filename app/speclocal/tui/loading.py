"""Loading the models in the App: resolve the configured pair to files, offer to fetch missing ones, check
them as the engine will (`check_load`: llama.cpp's compatibility rules, the memory estimate against each
pool), then load in a thread worker; each verdict that needs the user becomes a choice screen."""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from textual import work

from speclocal import locations, options
from speclocal.errors import SpeclocalError
from speclocal.models.plan import ModelPlan, check_load, plan_models
from speclocal.options import Settings
from speclocal.engine_process import LoadSpec
from speclocal.tui.backend import GenerationBackend
from speclocal.tui.messages import BackendLoaded, LoadFailed, PlanReady
from speclocal.tui.screens import ChoiceScreen, LoadingScreen, MissingModelsScreen

log = logging.getLogger("speclocal.tui")


def wants_draft_model(s: Settings) -> bool:
    return s.draft_source in ("model", "auto")


def load_key(s: Settings) -> tuple:
    """The settings whose change needs the models loaded again."""
    return (*options.load_key(s), wants_draft_model(s))


class ModelLoading:
    """The App's part that gets a backend for the configured models (a mixin of SpeclocalApp)."""

    def _start_models(self) -> None:
        s = self.settings
        want_draft = wants_draft_model(s) and not self._no_draft
        plan = plan_models(s.pair, s.main, s.draft, want_draft=want_draft, directory=s.models_dir or None)
        self.sub_title = plan.label
        if plan.error:
            self._status("no models")
            self.push_screen(ChoiceScreen("Cannot use these models", [plan.error],
                                          [("Settings", "settings"), ("Quit", "quit")], escape="dismiss"),
                             self._after_choice)
            return
        if plan.missing:
            self._status("models missing")
            self.push_screen(MissingModelsScreen(plan), self._after_choice)
            return
        self._status("loading…")
        detail = f"{plan.main_path.name}" + (f" + {plan.draft_path.name}" if plan.draft_path else "")
        self._loading = LoadingScreen(plan.label, detail)
        self.push_screen(self._loading)
        self._load(plan, s, self._force_memory or s.force)  # --force, or the user's "Load anyway"

    @work(thread=True, exclusive=True, group="load", exit_on_error=False)
    def _load(self, plan: ModelPlan, s: Settings, force: bool) -> None:
        t0 = time.monotonic()
        try:
            if self.inspect_models:
                check = check_load(plan.main_path, plan.draft_path, s.ctx_size, s.n_gpu_layers)
                if not check.compatible or (not check.fits and not force):
                    self.post_message(PlanReady(plan, check))
                    return
            backend = self.backend_factory(LoadSpec(plan.main_path, plan.draft_path, replace(s, force=force),
                                                    store_dir=locations.suffix_store_dir()))
        except SpeclocalError as e:
            self.post_message(LoadFailed(str(e)))
            return
        except Exception as e:  # noqa: BLE001 - shown to the user instead of a traceback
            log.exception("loading models failed")
            self.post_message(LoadFailed(f"{type(e).__name__}: {e}"))
            return
        self.post_message(BackendLoaded(backend, time.monotonic() - t0))

    def _close_loading(self) -> None:
        if self._loading is not None:
            if self._loading.is_attached and self.screen is self._loading:
                self._loading.dismiss()
            self._loading = None

    @property
    def _load_abandoned(self) -> bool:
        """Whether a load that ends now has no one to show it to: the user quit, or the App is closing (its
        screens are gone; a message posted by the load worker can arrive after that)."""
        return self._load_cancelled or not self.screen_stack

    def on_backend_loaded(self, msg: BackendLoaded) -> None:
        if self._load_abandoned:
            msg.backend.close()
            return
        self._close_loading()
        self._backend_ready(msg.backend, msg.seconds)
        self._save_settings()

    def _backend_ready(self, backend: GenerationBackend, seconds: float | None = None) -> None:
        self.backend = backend
        self.sub_title = backend.describe()
        try:
            self.memory = backend.memory()
        except Exception:  # noqa: BLE001 - memory is informational
            self.memory = None
        track = getattr(self.probe, "track", None)
        if track is not None:
            self._tracked_pid = getattr(backend, "pid", None)
            track(self._tracked_pid)  # RAM shown includes the engine process
        self._update_spec_title()
        if backend.notice:  # e.g. the weight layout the probe fell back to, and why: said once
            self.notify(backend.notice, title="Weight layout", severity="warning", timeout=15)
        self._status("ready" + (f" ({seconds:.1f} s load)" if seconds else ""))
        self.refresh_bindings()
        self._tick()

    def on_plan_ready(self, msg: PlanReady) -> None:
        if self._load_abandoned:
            return
        self._close_loading()
        lines = msg.check.lines + [""]
        if not msg.check.compatible:
            title = "This draft cannot draft for this main model"
            lines.append("llama.cpp would refuse this pair (the draft's tokens must mean the same as the main's). "
                         "Choose another draft in settings, or go on with prompt lookup (no draft model).")
            choices = [("Use prompt lookup", "no-draft"), ("Settings", "settings"), ("Quit", "quit")]
        else:
            title = "This pair may not fit in memory"
            lines.append("Loading it could make the machine swap or the process be killed.")
            choices = [("Settings", "settings"), ("Load anyway", "force"), ("Quit", "quit")]
        self._status("not loaded")
        self.push_screen(ChoiceScreen(title, lines, choices), self._after_choice)

    def on_load_failed(self, msg: LoadFailed) -> None:
        if self._load_abandoned:
            return
        self._close_loading()
        self._status("not loaded")
        choices = [("Settings", "settings"), ("Retry", "retry"), ("Quit", "quit")]
        if "memory" in msg.error.lower() or "ram" in msg.error.lower().split():
            choices.insert(2, ("Load anyway", "force"))
        self.push_screen(ChoiceScreen("Could not load the models", [msg.error], choices, escape="dismiss"),
                         self._after_choice)

    def _after_choice(self, value: str | None) -> None:
        if value == "quit":
            self.action_quit()
        elif value == "settings":
            self.action_settings()
        elif value in ("fetched", "retry"):
            self._start_models()
        elif value == "no-draft":
            self._no_draft = True
            self._start_models()
        elif value == "force":
            self._force_memory = True
            self._start_models()

