"""docs/results-protocol.md: the protocol as run, its tables, plots and the claims, from ``protocol.json``
alone, assembled from its sections (``page_setup``, ``page_tables``, ``page_claims``).

The page states every rule a reader needs to judge a verdict (paired seeds, the t test and the
exact sign-flip test of every comparison, claims tested against every baseline, Holm within three
families, verdicts only where both adjusted tests agree, what the exact test can reach with the
seeds run, the fixed checkpoints, the target fixed from validation data, censored times to target
resolved per iteration, the clip treatments) next to the numbers, and which test made each figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..common.stats import seeds_for_exact
from .claims import Test
from .page_claims import ablation_claims_section, claims_section
from .page_setup import protocol_section, reach_text
from .page_tables import ablations_table, pairs_tables, recipes_table, sweep_table, terms_table
from .results import PRIMARY_CLAIMS, ProtocolResult

GPU = (
    "## On a GPU: FLUX or SD3 with a model reward",
    "",
    "The same command takes a FLUX or SD3 config: every arm trains on top of it (the file as written, then "
    "`--set`), each baseline samples with the tree's number of steps and scores the tree's images per "
    "prompt (its group size; BranchGRPO's number of splits), and with the model on CUDA the seconds are wall "
    "seconds (`--clock auto`). For example, the paper's setting on FLUX.1-dev with HPS-v2.1 (docs/models.md "
    "says where each file comes from):",
    "",
    "```bash",
    "treerpo bench protocol configs/flux_dev_paper.yaml \\",
    "  --set model.path=/models/FLUX.1-dev \\",
    "  --set data.prompts=hpdv2_train.txt --set data.eval_prompts=hpdv2_test.txt \\",
    "  --set \"reward_weights={hps-v2.1: /models/HPS_v2.1_compressed.pt}\" \\",
    "  --set data.eval_pairs=64 \\",
    "  --arms dynamic_treerpo_euler,mixgrpo,flow_grpo_fast,diffusionnft --images 1024 \\",
    "  --out runs/protocol_flux --docs runs/protocol_flux/results.md",
    "```",
    "",
    "- **Cost.** Before training the command prints its plan (runs x iterations) and, after the sweep, the "
    "wall time the sweep's iteration and evaluation times predict for the part (with a warning when the "
    "main part is expected past 150 min). Every main arm and ablation at the default seeds is days of FLUX "
    "training: choose arms (`--arms`; MixGRPO sets the equal-seconds budget, else give `--seconds`), "
    "seeds (`--seeds`, at least 2 for the paired tests; a verdict needs the exact test too, which in a "
    "family of m tests needs 2m/2^seeds below 0.05: the default, "
    f"{seeds_for_exact(PRIMARY_CLAIMS)} seeds for the primary family's {PRIMARY_CLAIMS} claims), images "
    "(`--images`), checkpoints (`--checkpoints`), rates (`--lrs`, `--max-extensions`, `--sweep-iterations`) "
    "and parts (`--part main`, the default: the sweep and the main arms; `--part ablations` with the same "
    "`--out` afterwards: the ablation arms and the clip treatments). `--quick` is a smoke run of the same "
    "pipeline, every part in one command (2 seeds, one prompt per iteration, 16 scored images per run).",
    "- **Stopped runs.** `protocol.json` is saved after the sweep and after every test run; the same "
    "command with `--resume` keeps the sweep's rates and target and runs only what is missing (a different "
    "budget, bed or set of arms is refused in one line).",
    "- **Evaluation** is not charged to the budgets but takes time: `data.eval_pairs` images of "
    "`sampling.eval_steps` steps at each of up to 2 x 8 + 1 checkpoints per run, and after every iteration "
    "of a main arm's run until it reaches the target. The paper's 400 HPDv2 test prompts at 25 steps, 17 "
    "times a run, would outlast the training: set `data.eval_pairs` (64 above).",
    "- **Validation pairs** are drawn from the training prompt file (never from `data.eval_prompts`) with "
    "eval seed 777, leaving out every test prompt, so the training file must hold more distinct prompts "
    "than `data.eval_pairs`.",
    "- **Memory.** Runs follow each other in one process; each loads the model afresh and the previous one "
    "is freed first, so the GPU needs room for one run, as `treerpo train` does.",
    "",
)


SCOPE = (
    "## Scope",
    "",
    "- On the embedded default this is a 1.85M-parameter model on CPU with the task of the test bed above, "
    "not FLUX on GPUs. Forward counts are properties of the plans and carry over (`treerpo nfe`, "
    "training.md); seconds and rewards are the test bed's. The same command runs on a FLUX or SD3 config "
    "with a model reward (above).",
    "- Whether the budget separates gains from seed noise at all is the budget check above; differences "
    "between recipes much smaller than the default's own 95% half-width need more images or seeds than "
    "this page spends to leave \"inconclusive\".",
    "- Equal seconds give an arm with a cheaper iteration more iterations on the same prompts: a recipe "
    "that overshoots the reward's optimum with more updates loses there what it won at equal images. The "
    "curves show both.",
    "- Seeds are the outer loop, so a slow period hits the arms of one seed, not one arm; the per-iteration "
    "CPU and wall seconds of every run are in `protocol.json`.",
    "- Each held-out measurement is one fixed set of test prompt/seed pairs, the same for every arm, so its "
    "sampling noise is shared by the pairs compared but not removed from each arm's own figure.",
    "- The sampler's own overhead and memory: [sampler.md](sampler.md).",
)


HAND_WRITTEN = "<!-- written by hand: kept when the page is rebuilt -->"
"""The line below which a person writes on the protocol's page (what the verdicts rest on): a rebuild
keeps it and everything after it, so the prose survives a regenerated page."""


def with_hand_written(generated: str, old: str | None) -> str:
    """The page: ``generated``, then ``old`` (the page as it was) from its :data:`HAND_WRITTEN` line on;
    ``generated`` alone where there was no page or no such line."""
    kept = old[old.index(HAND_WRITTEN):] if old is not None and HAND_WRITTEN in old else ""
    return "\n\n".join(p for p in (generated.rstrip("\n"), kept.rstrip("\n")) if p) + "\n"


def _header(result: ProtocolResult) -> list[str]:
    """The commands that made the page's protocol.json, with the wall time of each part."""
    commands = result.command.splitlines() or ["treerpo bench protocol"]
    times = {"main": "main part", "ablations": "ablation part", "all": "every part"}
    parts = "; ".join(f"{times.get(k, k)} {v / 60:.0f} min" for k, v in result.part_wall_s.items())
    wall = f"wall time {result.wall_s / 60:.0f} min" + (f": {parts}" if len(result.part_wall_s) > 1 else "")
    how = "one command" if len(commands) == 1 else f"{len(commands)} commands, in order"
    return [f"Generated by {how} (it trains everything below; {wall}):", "", "```bash", *commands, "```", "",
            code_text(result.code)]


def code_text(code: Sequence[dict[str, Any]]) -> str:
    """Which code version made the runs: one for a published protocol."""
    from ..common.provenance import distinct, machines_line
    from ..common.provenance import version_name as name

    unique = distinct(code)
    if not unique:
        return "This protocol.json recorded no code version (it was made before 0.3.1)."

    parts = ", ".join(dict.fromkeys(c["part"] for c in code))
    where = machines_line(code)
    where = f" {where}" if where else ""
    if len(unique) == 1:
        return f"Every part ({parts}) ran at one code version: {name(unique[0])}.{where}"
    return "The parts ran at **more than one code version**: " + ", ".join(map(name, unique)) + f".{where}"


def markdown(result: ProtocolResult, tests: Sequence[Test], rows: Sequence[dict[str, Any]],
             image_dir: str) -> str:
    """docs/results-protocol.md: the protocol, its tables, plots and the claims tables."""
    by_key = {t.key: t for t in tests}
    where = "the embedded test bed" if result.config is None else f"`{result.config}`"
    lines = [
        f"# Results: the paper's claims on {where}",
        "",
        *_header(result),
        "",
        "Every figure below is computed from that run's `protocol.json` alone: `treerpo bench report --out "
        "<its --out folder> --docs <this page>` rebuilds the page without training. Each comparison shows "
        "the number of paired seeds and two tests, the paired t test and the exact sign-flip test, raw and "
        "Holm-adjusted; a verdict is printed only where both agree (the rules are below). "
        + reach_text(tests, result.budget.seeds),
        "",
        *protocol_section(result, tests),
        "## Learning-rate sweep (validation pairs)",
        "",
        *sweep_table(result),
        "",
        *recipes_table(result, rows),
        *terms_table(result),
        *pairs_tables(result, by_key, rows, image_dir),
        *ablations_table(result, by_key, rows),
        *claims_section(result, tests),
        *ablation_claims_section(result, tests),
        *GPU,
        *SCOPE,
        "",
    ]
    return "\n".join(lines)
