"""Bad input anywhere a user gives it (config keys and values, prompt files, workflow files, weight
and LoRA files, image folders): one line naming the problem on stderr, exit status 2, no traceback,
and nothing already saved lost. Run through ``treerpo``'s own entry point, in this process."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from dynamic_treerpo.trainer.cli import main

Make = Callable[[Path], list[str]]  # builds the bad input under tmp_path, returns the argv


def train(*sets: str, extra: tuple[str, ...] = ()) -> Make:
    return lambda tmp: ["train", "--out", str(tmp / "run"), "--no-progress", *extra,
                        *[a for s in sets for a in ("--set", s)]]


def with_file(name: str, content: bytes | str, argv: Callable[[Path], list[str]]) -> Make:
    def make(tmp: Path) -> list[str]:
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        return argv(path)
    return make


def images_and_prompts(tmp: Path, prompts: str = "a red circle\n") -> tuple[Path, Path]:
    folder = tmp / "images"
    folder.mkdir(exist_ok=True)
    Image.new("RGB", (32, 32), (200, 10, 10)).save(folder / "0.png")
    (tmp / "prompts.txt").write_text(prompts)
    return folder, tmp / "prompts.txt"


def score(reward: str, weights: Callable[[Path], Path | None], prompts: str = "a red circle\n") -> Make:
    def make(tmp: Path) -> list[str]:
        folder, file = images_and_prompts(tmp, prompts)
        w = weights(tmp)
        return ["score", "--reward", reward, "--images", str(folder), "--prompts", str(file),
                *(["--weights", str(w)] if w is not None else [])]
    return make


class Payload:
    """A pickle that would create a file when loaded: loading must refuse it, not run it."""

    def __reduce__(self):
        return (Path.touch, (Path(__file__).parent / ".payload_ran",))


def evil(tmp: Path, name: str) -> Path:
    path = tmp / name
    with path.open("wb") as f:
        pickle.dump({"state_dict": Payload()}, f)
    return path


def imagereward_folder_with_evil_weights(tmp: Path) -> Path:
    folder = tmp / "imagereward"
    folder.mkdir()
    fixture = Path(__file__).parent / "fixtures" / "imagereward_tiny"
    for name in ("med_config.json", "vocab.txt"):
        (folder / name).write_bytes((fixture / name).read_bytes())
    evil(folder, "ImageReward.pt")
    return folder


def lora_for_another_model(tmp: Path) -> Path:
    path = tmp / "other_lora.safetensors"
    layer = "diffusion_model.double_blocks.0.img_attn.qkv"  # a FLUX.1 layer: not the embedded model's
    save_file({f"{layer}.lora_down.weight": torch.zeros(4, 3072),
               f"{layer}.lora_up.weight": torch.zeros(9216, 4)}, str(path))
    return path


def sample(lora: Callable[[Path], Path]) -> Make:
    return lambda tmp: ["sample", "--prompt", "a red circle", "--lora", str(lora(tmp)),
                        "--out", str(tmp / "grid.png")]


CASES: dict[str, tuple[Make, str]] = {
    # ---- config keys and values (--set and YAML files)
    "unknown key": (train("tree.dept=3"), "unknown key 'tree.dept' (did you mean 'tree.depth'?)"),
    "unknown section": (train("trees.depth=3"), "unknown key 'trees'"),
    "not a number": (train("iterations=many"), "iterations: expected int"),
    "negative iterations": (train("iterations=-1"), "iterations must be >= 0"),
    "unknown strategy": (train("strategy=ppo"), "strategy"),
    "unknown model kind": (train("model.kind=sdxl"), "model.kind: expected one of 'embedded', 'flux', 'sd3'"),
    "flux without a path": (train("model.kind=flux"), "model.path is required for kind 'flux'"),
    "odd image size": (train("model.kind=flux", "model.path=x", "model.height=500"),
                       "image size must be a positive multiple of 16"),
    "zero LoRA rank": (train("lora.rank=0"), "rank must be >= 1"),
    "zero learning rate": (train("optim.lr=0"), "lr must be > 0"),
    "unknown reward": (train("reward=aesthetic"), "unknown reward 'aesthetic'"),
    "weights for a reward not used": (train("reward_weights={hps-v2.1: x.pt}"),
                                      "reward_weights names 'hps-v2.1', which is not in reward 'scene'"),
    "model reward without weights": (train("reward=hps-v2.1", "iterations=1"), "needs its weights"),
    "tree deeper than the steps": (train("tree.depth=12", "iterations=1"),
                                   "tree.steps is 10: too few for a window of 12 SDE steps"),
    "bad distributed backend": (train("distributed.backend=mpi"),
                                "distributed.backend must be auto, nccl or gloo"),
    "bad advantage std scope": (train("experimental.loss.advantage_std=worldwide", "iterations=1"),
                                "advantage_std"),
    "negative skip limit": (train("optim.max_skipped_in_a_row=-1"), "max_skipped_in_a_row must be >= 0"),
    "missing config file": (lambda tmp: ["train", str(tmp / "nope.yaml")], "nope.yaml"),
    "config that is not YAML": (with_file("bad.yaml", "iterations: [1, 2\n", lambda p: ["train", str(p)]),
                                "bad.yaml"),
    "config that is a list": (with_file("list.yaml", "- 1\n- 2\n", lambda p: ["train", str(p)]), "list.yaml"),
    # ---- prompt files
    "missing prompt file": (train("data.prompts=/nonexistent/prompts.txt", "iterations=1"),
                            "/nonexistent/prompts.txt"),
    "empty prompt file": (with_file("empty.txt", "\n\n", lambda p: train(f"data.prompts={p}", "iterations=1")(
        p.parent)), "empty.txt"),
    "binary prompt file": (with_file("bin.txt", b"\xff\xfe\x00\x81bad",
                                     lambda p: train(f"data.prompts={p}", "iterations=1")(p.parent)),
                           "bin.txt"),
    "prompt count not matching images": (score("scene", lambda t: None, prompts="one\ntwo\nthree\n"),
                                         "prompt"),
    # ---- workflow files
    "missing workflow": (lambda tmp: ["run-workflow", str(tmp / "none.json")], "workflow not found"),
    "workflow that is not JSON": (with_file("w.json", "{nodes: [", lambda p: ["run-workflow", str(p)]),
                                  "is not JSON"),
    "JSON that is not a workflow": (with_file("w.json", "[1, 2, 3]", lambda p: ["run-workflow", str(p)]),
                                    "is not a ComfyUI workflow"),
    # ---- weight files, LoRAs, images
    "missing reward weights": (score("hps-v2.1", lambda t: t / "missing.pt"), "missing.pt"),
    "malicious pickle as HPS weights": (score("hps-v2.1", lambda t: evil(t, "evil.pt")), "evil.pt"),
    "malicious pickle as ImageReward weights": (score("imagereward", imagereward_folder_with_evil_weights),
                                                "ImageReward.pt"),
    "corrupt safetensors LoRA": (sample(lambda t: (t / "bad.safetensors").open("wb").write(b"garbage!") and
                                        t / "bad.safetensors"), "bad.safetensors"),
    "LoRA for another model": (sample(lora_for_another_model), "does not fit this model"),
    "missing LoRA": (sample(lambda t: t / "none.safetensors"), "none.safetensors"),
    "missing embedded model folder": (lambda tmp: ["sample", "--prompt", "x", "--model", str(tmp / "nomodel"),
                                                   "--out", str(tmp / "g.png")], "nomodel"),
    "image folder missing": (with_file("p.txt", "a red circle\n", lambda p: [
        "score", "--reward", "scene", "--images", str(p.parent / "noimg"), "--prompts", str(p)]), "noimg"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line_exit_2(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make, expected = CASES[name]
    marker = Path(__file__).parent / ".payload_ran"
    marker.unlink(missing_ok=True)
    code = main(make(tmp_path))
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("treerpo ") and ": error: " in lines[0], err
    assert expected in lines[0], err
    assert not marker.exists(), "the pickle ran"


def test_there_are_at_least_thirty_cases() -> None:
    assert len(CASES) >= 30
