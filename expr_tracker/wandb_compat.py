"""The keywords wandb's ``init`` takes, mapped onto ours (``et.init`` and ``et.Run``).

Training code written for wandb passes them; none raises here (except a value no wandb
accepts either: an unknown ``mode`` or ``reinit``). What has a meaning is applied:

===========================  ==========================================================
``entity``, ``job_type``      spec fields (``run.json``, ``run.entity``/``run.job_type``)
``id``                        the run's name: ``id=X`` continues the run named X
                              (whatever its config; never moved to ``X-2``)
``mode``                      ``disabled``: a no-op run; ``offline``/``dryrun``: what we
                              always are; ``online``/``run``/``shared``: local too (one
                              warning)
``reinit``                    ``True``/``"finish_previous"``: finish the current run
                              first; ``"create_new"``: an independent run (``et.Run``);
                              ``"return_previous"``: the current run; ``False``/
                              ``"default"``/None: ``RunAlreadyActiveError`` while one is
                              active
``resume``                    ``True``/``"auto"`` -> ``"allow"``; ``False``/None -> the
                              default (``allow``); ``allow``/``never``/``must`` as given
``allow_val_change``          the run's config accepts changed values
``config_include_keys`` /     applied to the config's top-level keys before it is saved
``config_exclude_keys``
``config``                    also an ``argparse.Namespace``, or a YAML file path (wandb's
                              ``config-defaults.yaml`` form ``{key: {value: v}}`` too)
===========================  ==========================================================

``settings``, ``save_code``, ``anonymous``, ``sync_tensorboard``/``tensorboard``,
``monitor_gym``, ``magic``, ``force``, ``fork_from`` and ``resume_from`` have no meaning
for local files: each is ignored with one warning per process.

``log(data=...)`` (wandb's name of ``log``'s first argument) is
:func:`expr_tracker.runs.wandb_data_arg`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from expr_tracker._warn import Warner

__all__ = ["IGNORED", "MODES", "REINIT", "InitCall", "wandb_init_call"]

log = logging.getLogger("expr_tracker")

#: wandb's mode names -> ours
MODES = {
    "offline": "offline",
    "dryrun": "offline",
    "online": "online",
    "run": "online",
    "shared": "online",
    "disabled": "disabled",
}
#: wandb's reinit values -> what et.init does with a run already active
REINIT = {
    True: "finish_previous",
    False: "error",
    None: "error",
    "default": "error",
    "finish_previous": "finish_previous",
    "create_new": "create_new",
    "return_previous": "return_previous",
}
#: wandb keywords without a meaning here (ignored, one warning each)
IGNORED = {
    "settings": "wandb's settings object configures its own service",
    "save_code": "the run records the git commit (run.json) rather than a code copy",
    "anonymous": "runs are local files; there is no account",
    "sync_tensorboard": "TensorBoard files are not read",
    "tensorboard": "TensorBoard files are not read",
    "monitor_gym": "gym videos are not recorded",
    "magic": "no automatic instrumentation",
    "force": "there is no login to force",
    "fork_from": "runs are not forked from another run's step",
    "resume_from": "runs are not rewound to a step (resume continues at the last one)",
}
_WANDB_ONLY = frozenset(
    {"id", "mode", "reinit", "allow_val_change", "config_include_keys", "config_exclude_keys"}
    | set(IGNORED)
)

_warner = Warner(log)


@dataclass
class InitCall:
    """``et.init`` arguments after the wandb mapping.

    ``given``: the keywords for the spec (``project``, ``name``, ``config`` and every spec
    keyword; the wandb-only ones removed); ``reinit``: ``"error"``, ``"finish_previous"``,
    ``"create_new"`` or ``"return_previous"``; ``allow_val_change``: the config's default;
    ``pinned``: ``id=`` was given, so the run's name is fixed (continued or started, never
    moved to ``<name>-2`` for another config).
    """

    given: dict[str, Any]
    reinit: str = "error"
    allow_val_change: bool = False
    pinned: bool = False


def _issue(path: str, message: str, value: Any) -> Exception:
    from expr_tracker.spec.errors import SpecError, SpecIssue

    return SpecError(
        [SpecIssue(path, message, value, source="init")], title="invalid et.init() arguments"
    )


def wandb_init_call(
    project: str | None, name: str | None, config: Any, kwargs: dict[str, Any]
) -> InitCall:
    """Map the arguments of one ``et.init``/``et.Run`` call (see the module docstring).

    Keywords that are neither wandb's nor ours stay in ``given``: the spec rejects them
    with close matches, as before.

    Raises:
        SpecError: an unknown ``mode`` or ``reinit`` value (naming the valid ones).
    """
    given = {k: v for k, v in kwargs.items() if k not in _WANDB_ONLY}
    run_id = kwargs.get("id")
    if run_id is not None:
        if name is not None and name != run_id:
            _warner.warn(
                ("id_and_name",),
                "expr_tracker: et.init(id=%r, name=%r): a run is stored under one name; "
                "the id is used (it names the run directory, so the run can be continued)",
                run_id,
                name,
            )
        name = run_id
    mode = kwargs.get("mode")
    if mode is not None:
        ours = MODES.get(mode) if isinstance(mode, str) else None
        if ours is None:
            raise _issue("mode", f"must be one of {', '.join(MODES)}", mode)
        if ours == "online":
            _warner.warn(
                ("mode_online",),
                "expr_tracker: mode=%r: expr_tracker is local-only; the run is written to "
                "local files (mirror it to wandb with backends=['wandb'])",
                mode,
            )
        given["mode"] = ours
    reinit_value = kwargs.get("reinit")
    try:
        reinit = REINIT[reinit_value]
    except (KeyError, TypeError):
        valid = "True, False, None, " + ", ".join(repr(k) for k in REINIT if isinstance(k, str))
        raise _issue("reinit", f"must be one of {valid}", reinit_value) from None
    if "resume" in given:
        resume = given["resume"]
        if resume is True or resume == "auto":
            given["resume"] = "allow"
        elif resume is False or resume is None:
            del given["resume"]
    for key, why in IGNORED.items():
        value = kwargs.get(key)
        if value is None or value is False or (key == "settings" and not value):
            continue
        _warner.warn(
            ("wandb_keyword", key),
            "expr_tracker: et.init(%s=...) is wandb's and has no meaning here (%s); ignored",
            key,
            why,
        )
    config = _config_of(
        config, kwargs.get("config_include_keys"), kwargs.get("config_exclude_keys")
    )
    if project is not None:
        given["project"] = project
    if name is not None:
        given["name"] = name
    if config is not None:
        given["config"] = config
    return InitCall(given, reinit, bool(kwargs.get("allow_val_change")), run_id is not None)


def _config_of(config: Any, include: Any, exclude: Any) -> Any:
    """The config as the spec takes it: a YAML path read, a Namespace as its dict, and
    ``config_include_keys``/``config_exclude_keys`` applied to its top-level keys."""
    from expr_tracker.runconfig import config_mapping

    if isinstance(config, (str, os.PathLike)):
        config = _read_config_file(config)
    elif config is not None and not isinstance(config, dict) and hasattr(config, "_get_kwargs"):
        config = vars(config)  # argparse.Namespace
    if include is None and exclude is None:
        return config
    if config is None:
        return None
    keys = config_mapping(config)
    if include is not None:
        wanted = set(_key_list("config_include_keys", include))
        keys = {k: v for k, v in keys.items() if k in wanted}
    if exclude is not None:
        dropped = set(_key_list("config_exclude_keys", exclude))
        keys = {k: v for k, v in keys.items() if k not in dropped}
    return keys


def _key_list(what: str, keys: Any) -> list[str]:
    if isinstance(keys, str):
        return [keys]
    try:
        return [str(k) for k in keys]
    except TypeError:
        raise _issue(what, "must be a list of config keys", keys) from None


def _read_config_file(path: Any) -> dict[str, Any]:
    """A YAML (or JSON) config file; wandb's ``{key: {value: v, desc: ...}}`` form is
    unwrapped to ``{key: v}``."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as exc:
        raise _issue("config", f"cannot read the config file: {exc}", os.fspath(path)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise _issue("config", "the config file must hold a mapping", os.fspath(path))
    out = {}
    for k, v in data.items():
        if k == "wandb_version":
            continue
        if isinstance(v, dict) and "value" in v and set(v) <= {"value", "desc"}:
            v = v["value"]
        out[str(k)] = v
    return out
