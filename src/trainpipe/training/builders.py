"""What rebuilds a saved model, as a reference that travels: framework-free (the torch and
TensorFlow contexts share it)."""

from __future__ import annotations

from typing import Any

from trainpipe.contract.errors import InputError
from trainpipe.contract.imports import import_module

NETS_MODULE = "trainpipe.services.serving.nets"
BUILTIN_NETS = ("mlp", "cnn")
#: Packages every served model installs (trainpipe.services.serving.package.requirements pins them): a model
#: class of theirs (``torch.nn.Linear``, ``torch.nn.Sequential``) is imported there, not shipped. Shipping
#: it would copy the whole framework into the model (torch: 663 MB, 6,916 files).
INSTALLED_WITH_THE_MODEL = frozenset({"torch", "numpy", "pandas", "safetensors"})


def builder_reference(builder: Any) -> tuple[str, list[str]]:
    """``("package.module:Name", [top-level package])`` of what rebuilds a model; a built-in net is
    ``("builtin:<name>", [])``. What cannot travel with the model is refused.

    Raises:
        InputError: a local or ``__main__`` callable, a lambda, one its module does not export by
            name, or code that lives in trainpipe (a served model does not have trainpipe).
    """
    if isinstance(builder, str):
        if builder.startswith("builtin:"):
            if builder.split(":", 1)[1] not in BUILTIN_NETS:
                raise InputError(
                    f"save_model: unknown built-in {builder!r} (built in: "
                    f"{', '.join('builtin:' + n for n in BUILTIN_NETS)})"
                )
            return builder, []
        module_name, _, qualname = builder.partition(":")
    else:
        module_name = getattr(builder, "__module__", None) or ""
        qualname = getattr(builder, "__qualname__", None) or ""
        if module_name == NETS_MODULE and qualname in BUILTIN_NETS:
            return f"builtin:{qualname}", []
    shown = f"{module_name}:{qualname}"
    if not module_name or not qualname or module_name == "__main__" or "<" in qualname:
        raise InputError(
            f"save_model: {shown} is not importable by name (a local, lambda or __main__ object); define the model "
            "class "
            "at module level in a package: its code travels with the model"
        )
    if module_name.split(".")[0] == "trainpipe":
        raise InputError(
            f"save_model: {shown} lives in trainpipe, which a served model does not have; use builder='builtin:mlp' "
            "(or cnn) or your own package"
        )
    try:
        obj: Any = import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        raise InputError(
            f"save_model: {shown} cannot be imported by name; its code cannot travel with the model"
        ) from None
    if not isinstance(builder, str) and obj is not builder:
        raise InputError(f"save_model: {shown} names another object than the one given")
    top = module_name.split(".")[0]
    if top in INSTALLED_WITH_THE_MODEL:
        return shown, []
    from trainpipe.services.serving.package import code_location

    code_location(top)  # refuses code that cannot be copied, in one line
    return shown, [top]
