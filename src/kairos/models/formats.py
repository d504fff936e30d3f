"""Save and load each framework's models in its own safe format, and read their schemas.

| framework            | artifact                                   | format          |
|----------------------|--------------------------------------------|-----------------|
| scikit-learn         | skops (no pickle; types checked on load)   | skops           |
| XGBoost              | the booster's UBJSON                       | xgboost-ubj     |
| LightGBM             | the booster's text model                   | lightgbm-text   |
| CatBoost             | the model's .cbm                           | catboost-cbm    |
| PyTorch              | `torch.export` program (.pt2)              | torch-export    |
| ONNX                 | the ModelProto bytes                       | onnx            |
| a class with predict | tar: class path + files (class.load(dir))  | custom          |
| anything, opted in   | tar: pickle + files (allow_pickle=True)    | custom-pickle   |

Framework libraries are imported only when a model of theirs is saved or loaded.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import pickle
import shutil
import tarfile
import tempfile
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kairos.models.errors import UnsupportedModel
from kairos.models.schema import ModelSchema, positional_names

# Rows in (n, n_features) -> class probabilities (n, k) for classifiers, values otherwise.
Infer = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Saved:
    """An artifact's bytes and what loading it needs."""

    data: bytes
    framework: str
    format: str
    schema: ModelSchema
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. skops' trusted types


def framework_of(model: Any) -> str:
    """ "sklearn", "xgboost", "lightgbm", "catboost", "torch", "onnx" or "custom"."""
    modules = [c.__module__ for c in type(model).__mro__]
    for name in ("xgboost", "lightgbm", "catboost", "torch", "onnx"):
        if any(m == name or m.startswith(name + ".") for m in modules):
            return name
    if any(m.startswith("sklearn.") for m in modules):
        return "sklearn"
    if callable(getattr(model, "predict", None)):
        return "custom"
    raise UnsupportedModel(
        f"cannot register a {type(model).__name__}: kairos takes scikit-learn, XGBoost, "
        "LightGBM, CatBoost, PyTorch and ONNX models, or an object with a predict(df) method"
    )


def save(
    model: Any,
    *,
    inputs: Sequence[str] | None = None,
    output: str | None = None,
    sample: np.ndarray | None = None,
    files: Sequence[str | Path] = (),
    allow_pickle: bool = False,
) -> Saved:
    """Serialize `model` in its framework's safe format and infer its schema."""
    framework = framework_of(model)
    if files and framework != "custom":
        raise UnsupportedModel(
            f"files= is for models defined by your own class; a {framework} model's artifact "
            "holds everything it needs"
        )
    saver = _SAVERS[framework]
    if framework == "custom":
        return _save_custom(model, inputs, output, sample, files, allow_pickle)
    return saver(model, inputs, output, sample)


def load(data: bytes, framework: str, format: str, extra: dict[str, Any]) -> Infer:
    """The inference function of a saved artifact (bytes already verified by the caller)."""
    loader = _LOADERS.get(format)
    if loader is None:
        raise UnsupportedModel(f"unknown artifact format {format!r} ({framework})")
    return loader(data, extra)


# --- schema helpers ------------------------------------------------------------------------


def _names(
    model: Any, count: int | None, inputs: Sequence[str] | None
) -> tuple[tuple[str, ...], bool]:
    if inputs is not None:
        names = tuple(str(n) for n in inputs)
        if count is not None and len(names) != count:
            raise UnsupportedModel(
                f"inputs= names {len(names)} columns but the model takes {count}; name each"
            )
        return names, True
    found = getattr(model, "feature_names_in_", None)
    if found is not None:
        return tuple(str(n) for n in found), True
    if count is None:
        raise UnsupportedModel(
            "cannot tell how many inputs the model takes; pass inputs=[...names...] or sample="
        )
    return positional_names(count), False


def _output(classes: Any, output: str | None, can_proba: bool) -> str:
    if output is not None:
        if output not in ("probability", "label", "value"):
            raise UnsupportedModel(f"output={output!r}; use 'probability', 'label' or 'value'")
        if output != "value" and classes is None:
            raise UnsupportedModel(f"output={output!r} is for classifiers; use 'value'")
        if output == "probability" and not can_proba:
            raise UnsupportedModel("this classifier has no probabilities; use output='label'")
        return output
    if classes is None:
        return "value"
    return "probability" if can_proba else "label"


def _classes(model: Any) -> tuple[Any, ...] | None:
    classes = getattr(model, "classes_", None)
    return None if classes is None else tuple(np.asarray(classes).tolist())


def _schema(
    model: Any, count: int | None, inputs: Any, output: str | None, dtype: str = "float64"
) -> ModelSchema:
    names, named = _names(model, count, inputs)
    classes = _classes(model)
    can_proba = callable(getattr(model, "predict_proba", None))
    return ModelSchema(names, dtype, classes, _output(classes, output, can_proba), (), named)


# --- scikit-learn: skops ---------------------------------------------------------------------


def _save_sklearn(model: Any, inputs: Any, output: str | None, sample: Any) -> Saved:
    import skops.io as sio

    count = getattr(model, "n_features_in_", None)
    if count is None:
        raise UnsupportedModel(f"the {type(model).__name__} is not fitted; fit it, then register")
    data = sio.dumps(model)
    trusted = sio.get_untrusted_types(data=data)
    schema = _schema(model, int(count), inputs, output)
    raw = "proba" if schema.output == "probability" else schema.output
    return Saved(data, "sklearn", "skops", schema, {"trusted": trusted, "raw": raw})


def _load_sklearn(data: bytes, extra: dict[str, Any]) -> Infer:
    import skops.io as sio

    needed = sio.get_untrusted_types(data=data)
    unknown = sorted(set(needed) - set(extra.get("trusted", ())))
    if unknown:
        raise UnsupportedModel(
            f"the artifact needs types that were not recorded at registration: {unknown}"
        )
    model = sio.loads(data, trusted=needed)
    _drop_feature_names(model)  # kairos passes arrays in schema order; names were checked
    if extra.get("raw") == "proba":
        return model.predict_proba  # type: ignore[no-any-return]
    return model.predict  # type: ignore[no-any-return]


def _drop_feature_names(model: Any) -> None:
    """Fitted on a DataFrame, an estimator warns on every array; the schema keeps the names."""
    seen: set[int] = set()

    def walk(obj: Any) -> None:
        if id(obj) in seen or not hasattr(obj, "get_params"):
            return
        seen.add(id(obj))
        if hasattr(obj, "feature_names_in_") and type(obj).__name__ != "ColumnTransformer":
            with contextlib.suppress(AttributeError):
                del obj.feature_names_in_
        for value in obj.get_params(deep=False).values():
            walk(value)
        for step in getattr(obj, "steps", ()) or ():
            walk(step[1])
        for fitted in getattr(obj, "estimators_", ()) or ():
            walk(fitted)

    walk(model)


# --- XGBoost: the booster's UBJSON ---------------------------------------------------------


def _save_xgboost(model: Any, inputs: Any, output: str | None, sample: Any) -> Saved:
    booster = model.get_booster() if hasattr(model, "get_booster") else model
    data = bytes(booster.save_raw("ubj"))
    names = inputs
    if names is None and booster.feature_names is not None:
        names = booster.feature_names
    schema = _schema(model, booster.num_features(), names, output)
    return Saved(data, "xgboost", "xgboost-ubj", schema, _booster_extra(schema))


def _load_xgboost(data: bytes, extra: dict[str, Any]) -> Infer:
    import xgboost

    booster = xgboost.Booster()
    booster.load_model(bytearray(data))
    booster.feature_names = None  # arrays arrive in schema order
    binary = extra.get("classes") is not None and len(extra["classes"]) == 2

    def infer(rows: np.ndarray) -> np.ndarray:
        out = np.asarray(booster.inplace_predict(rows))
        return _two_columns(out) if binary else out

    return infer


def _booster_extra(schema: ModelSchema) -> dict[str, Any]:
    return {"classes": schema.classes, "raw": "proba" if schema.classes else "value"}


def _two_columns(p: np.ndarray) -> np.ndarray:
    """P(class 1) as the (n, 2) matrix predict_proba returns."""
    return p if p.ndim == 2 else np.column_stack((1.0 - p, p))


# --- LightGBM: the booster's text model ------------------------------------------------------


def _save_lightgbm(model: Any, inputs: Any, output: str | None, sample: Any) -> Saved:
    booster = model.booster_ if hasattr(model, "booster_") else model
    data = booster.model_to_string().encode()
    names = inputs
    if names is None and getattr(model, "feature_names_in_", None) is None:
        found = booster.feature_name()
        if not all(n.startswith("Column_") for n in found):
            names = found
    schema = _schema(model, booster.num_feature(), names, output)
    return Saved(data, "lightgbm", "lightgbm-text", schema, _booster_extra(schema))


def _load_lightgbm(data: bytes, extra: dict[str, Any]) -> Infer:
    import lightgbm

    booster = lightgbm.Booster(model_str=data.decode())
    binary = extra.get("classes") is not None and len(extra["classes"]) == 2

    def infer(rows: np.ndarray) -> np.ndarray:
        out = np.asarray(booster.predict(rows))
        return _two_columns(out) if binary else out

    return infer


# --- CatBoost: .cbm --------------------------------------------------------------------------


def _save_catboost(model: Any, inputs: Any, output: str | None, sample: Any) -> Saved:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.cbm"
        model.save_model(str(path), format="cbm")
        data = path.read_bytes()
    names = inputs
    found = list(getattr(model, "feature_names_", None) or [])
    if names is None and found and not all(n.isdigit() for n in found):
        names = found
    schema = _schema(model, len(found) or None, names, output)
    return Saved(data, "catboost", "catboost-cbm", schema, _booster_extra(schema))


def _load_catboost(data: bytes, extra: dict[str, Any]) -> Infer:
    import catboost

    model = catboost.CatBoost()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.cbm"
        path.write_bytes(data)
        model.load_model(str(path), format="cbm")
    if extra.get("classes") is not None:
        return lambda rows: np.asarray(model.predict(rows, prediction_type="Probability"))
    return lambda rows: np.asarray(model.predict(rows))


# --- PyTorch: torch.export ---------------------------------------------------------------------


def _save_torch(model: Any, inputs: Any, output: str | None, sample: Any) -> Saved:
    import torch

    count = None if sample is None else int(np.asarray(sample).shape[1])
    if count is None and inputs is not None:
        count = len(inputs)
    if count is None:
        first = next((m for m in model.modules() if isinstance(m, torch.nn.Linear)), None)
        count = None if first is None else int(first.in_features)
    if count is None:
        raise UnsupportedModel(
            "cannot tell how many inputs the torch module takes; pass sample= (a few rows) "
            "or inputs=[...names...]"
        )
    model.eval()
    example = torch.zeros((2, count), dtype=torch.float32)
    batch = torch.export.Dim("batch")
    program = torch.export.export(model, (example,), dynamic_shapes=({0: batch},))
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    names, named = _names(model, count, inputs)
    if output not in (None, "value"):
        raise UnsupportedModel("a torch module's output is its values; use output='value'")
    schema = ModelSchema(names, "float32", None, "value", (), named)
    return Saved(buffer.getvalue(), "torch", "torch-export", schema)


def _load_torch(data: bytes, extra: dict[str, Any]) -> Infer:
    import torch

    module = torch.export.load(io.BytesIO(data)).module()

    def infer(rows: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            out = module(torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float32)))
        return out.numpy()  # type: ignore[no-any-return]

    return infer


# --- ONNX ----------------------------------------------------------------------------------


def _save_onnx(model: Any, inputs: Any, output: str | None, sample: Any) -> Saved:
    data = model.SerializeToString()
    import onnxruntime

    session = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
    first = session.get_inputs()
    if len(first) != 1 or len(first[0].shape) != 2 or not isinstance(first[0].shape[1], int):
        raise UnsupportedModel(
            "kairos serves ONNX models with one 2-D input (batch, features); this one has "
            + ", ".join(f"{i.name}{i.shape}" for i in first)
        )
    count = int(first[0].shape[1])
    dtype = "float32" if first[0].type == "tensor(float)" else "float64"
    outputs = [o.name for o in session.get_outputs()]
    index = outputs.index("probabilities") if "probabilities" in outputs else 0
    names, named = _names(model, count, inputs)
    probs = session.get_outputs()[index].shape
    classes = None
    if outputs[index] == "probabilities" and len(probs) == 2 and isinstance(probs[1], int):
        classes = tuple(range(probs[1]))
    kind = _output(classes, output, classes is not None)
    schema = ModelSchema(names, dtype, classes, kind, (), named)
    return Saved(
        data,
        "onnx",
        "onnx",
        schema,
        {"output_index": index, "dtype": dtype, "raw": "proba" if classes else "value"},
    )


def _load_onnx(data: bytes, extra: dict[str, Any]) -> Infer:
    import onnxruntime

    session = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    index = int(extra.get("output_index", 0))
    dtype = np.dtype(extra.get("dtype", "float32"))
    wanted = [session.get_outputs()[index].name]

    def infer(rows: np.ndarray) -> np.ndarray:
        return np.asarray(session.run(wanted, {name: rows.astype(dtype, copy=False)})[0])

    return infer


# --- a user's class: predict(df) plus files ----------------------------------------------------


def _save_custom(
    model: Any,
    inputs: Sequence[str] | None,
    output: str | None,
    sample: Any,
    files: Sequence[str | Path],
    allow_pickle: bool,
) -> Saved:
    cls = type(model)
    names = inputs if inputs is not None else getattr(model, "inputs", None)
    if names is None:
        raise UnsupportedModel(
            f"{cls.__name__}: say which columns predict(df) reads with inputs=[...names...]"
        )
    loads = callable(getattr(cls, "load", None)) and "<locals>" not in cls.__qualname__
    if not loads and not allow_pickle:
        raise UnsupportedModel(
            f"{cls.__name__} has no load(folder) classmethod, so saving it needs pickle, "
            "which runs code when loaded; add `@classmethod def load(cls, folder)` that "
            "rebuilds it from its files, or pass allow_pickle=True if you trust every reader"
        )
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        if loads:
            manifest = {"class": f"{cls.__module__}:{cls.__qualname__}"}
            _add(tar, "kairos-custom.json", json.dumps(manifest).encode())
        else:
            _add(tar, "model.pkl", pickle.dumps(model, protocol=5))
        for path in sorted(Path(f) for f in files):
            if not path.exists():
                raise UnsupportedModel(f"files=: {str(path)!r} does not exist")
            for item in sorted([path, *path.rglob("*")] if path.is_dir() else [path]):
                if item.is_file():
                    relative = item.relative_to(path.parent)
                    _add(tar, f"files/{relative.as_posix()}", item.read_bytes())
    kind = _output(_classes(model), output, callable(getattr(model, "predict_proba", None)))
    schema = ModelSchema(tuple(str(n) for n in names), "float64", _classes(model), kind, (), True)
    fmt = "custom" if loads else "custom-pickle"
    return Saved(
        buffer.getvalue(),
        "custom",
        fmt,
        schema,
        {"inputs": list(schema.inputs), "raw": "proba" if kind == "probability" else kind},
    )


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)  # mtime 0, uid 0: the same files give the same sha256
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _load_custom(data: bytes, extra: dict[str, Any]) -> Infer:
    folder = Path(tempfile.mkdtemp(prefix="kairos-model-"))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(folder, filter="data")  # refuses absolute paths and links out
    manifest = folder / "kairos-custom.json"
    if manifest.exists():
        module, _, qualname = json.loads(manifest.read_text())["class"].partition(":")
        cls: Any = importlib.import_module(module)
        for part in qualname.split("."):
            cls = getattr(cls, part)
        model = cls.load(folder / "files")
    else:
        model = pickle.loads((folder / "model.pkl").read_bytes())  # opted in at registration
    inputs = list(extra["inputs"])

    def infer(rows: np.ndarray) -> np.ndarray:
        return np.asarray(model.predict(_frame(rows, inputs)))

    # The model may read its files at any time; they go when the model is unloaded.
    weakref.finalize(infer, shutil.rmtree, folder, True)
    return infer


def _frame(rows: np.ndarray, inputs: list[str]) -> Any:
    try:
        import pandas
    except ImportError:  # pandas is optional: a mapping of columns then
        return {name: rows[:, i] for i, name in enumerate(inputs)}
    return pandas.DataFrame(rows, columns=inputs)


_SAVERS: dict[str, Callable[..., Saved]] = {
    "sklearn": _save_sklearn,
    "xgboost": _save_xgboost,
    "lightgbm": _save_lightgbm,
    "catboost": _save_catboost,
    "torch": _save_torch,
    "onnx": _save_onnx,
    "custom": _save_sklearn,  # unused: custom models go through _save_custom
}
_LOADERS: dict[str, Callable[[bytes, dict[str, Any]], Infer]] = {
    "skops": _load_sklearn,
    "xgboost-ubj": _load_xgboost,
    "lightgbm-text": _load_lightgbm,
    "catboost-cbm": _load_catboost,
    "torch-export": _load_torch,
    "onnx": _load_onnx,
    "custom": _load_custom,
    "custom-pickle": _load_custom,
}


def from_artifact(data: bytes, format: str) -> Any:
    """A model object from an uploaded artifact in a safe format, to register as usual
    (so its schema is inferred the same way); nothing here unpickles."""
    try:
        if format == "onnx":
            import onnx

            return onnx.load_from_string(data)
        if format == "skops":
            import skops.io as sio

            untrusted = sio.get_untrusted_types(data=data)
            if untrusted:
                raise UnsupportedModel(
                    f"the skops file needs types skops does not trust by default ({untrusted}); "
                    "register it from Python, where you can review them"
                )
            return sio.loads(data, trusted=[])
        if format in ("xgboost-ubj", "xgboost-json"):
            import xgboost

            booster = xgboost.Booster()
            booster.load_model(bytearray(data))
            return booster
        if format == "lightgbm-text":
            import lightgbm

            return lightgbm.Booster(model_str=data.decode())
        if format == "catboost-cbm":
            import catboost

            model = catboost.CatBoost()
            with tempfile.TemporaryDirectory() as folder:
                path = Path(folder) / "model.cbm"
                path.write_bytes(data)
                model.load_model(str(path), format="cbm")
            return model
    except UnsupportedModel:
        raise
    except Exception as error:
        raise UnsupportedModel(
            f"the body is not a valid {format} artifact ({type(error).__name__}: {error})"
        ) from None
    raise UnsupportedModel(f"unknown artifact format {format!r}")
