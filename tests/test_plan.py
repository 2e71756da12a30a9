"""Matrix expansion, variants, smoke overrides, fingerprints and run order."""

from __future__ import annotations

from pathlib import Path

from conftest import SCENARIOS, write_scenario

from suite.spec import plan, scenario

TEXT = """\
name: grid
question: How does the grid expand?
model: {hidden: [64, 32]}
training: {epochs: 3}
repeats: 2
matrix:
  model.hidden.0: [16, 64]
  device: [cpu, gpu]
variants:
  - name: plain
  - name: xla
    set: {training.jit_compile: true}
smoke:
  training.epochs: 1
"""


def _specs(tmp_path: Path, **kw) -> list[plan.RunSpec]:
    return plan.expand(scenario.load(write_scenario(tmp_path, "grid", TEXT)), **kw)


def test_cartesian_product_of_variants_and_matrix(tmp_path: Path) -> None:
    specs = _specs(tmp_path)
    assert len(specs) == 2 * 2 * 2 * 2  # variants x widths x devices x repeats
    labels = [s.point_label for s in specs if s.repetition == 0]
    assert labels[0] == "variant=plain, width=16, device=cpu"
    assert labels[-1] == "variant=xla, width=64, device=gpu"
    xla = [s for s in specs if s.point["variant"] == "xla"]
    assert all(s.config["training"]["jit_compile"] for s in xla)
    assert {s.config["model"]["hidden"][0] for s in specs} == {16, 64}
    assert all(s.config["model"]["hidden"][1] == 32 for s in specs)


def test_repetition_major_order(tmp_path: Path) -> None:
    specs = _specs(tmp_path)
    reps = [s.repetition for s in specs]
    assert reps == sorted(reps), "every point runs once before any runs twice"
    assert [s.order for s in specs] == list(range(len(specs)))


def test_smoke_overrides_and_one_repetition(tmp_path: Path) -> None:
    specs = _specs(tmp_path, smoke=True)
    assert len(specs) == 8
    assert all(s.smoke and s.config["training"]["epochs"] == 1 for s in specs)


def test_fingerprint_tracks_what_is_measured(tmp_path: Path) -> None:
    specs = _specs(tmp_path)
    rep0 = {s.point_label: s.fingerprint for s in specs if s.repetition == 0}
    rep1 = {s.point_label: s.fingerprint for s in specs if s.repetition == 1}
    assert rep0 == rep1, "repetitions of one point share the fingerprint"
    assert len(set(rep0.values())) == len(rep0), "different points differ"
    smoke = {s.point_label: s.fingerprint for s in _specs(tmp_path, smoke=True)}
    assert not set(smoke.values()) & set(rep0.values()), "smoke size is a different measurement"
    again = {s.point_label: s.fingerprint for s in _specs(tmp_path) if s.repetition == 0}
    assert again == rep0, "stable across loads"
    spec = specs[0]
    assert spec.to_dict()["fingerprint"] == plan.fingerprint_of(spec)


def test_a_smoke_run_is_its_own_measurement_even_at_the_full_size(tmp_path: Path) -> None:
    # A smoke section that changes nothing: only the size's name tells the runs apart, and a smoke
    # run must neither resume from nor stand in for a full-size result.
    text = TEXT.replace("training.epochs: 1", "training.epochs: 3")
    sc = scenario.load(write_scenario(tmp_path, "grid", text))
    full = {s.point_label: s for s in plan.expand(sc) if s.repetition == 0}
    smoke = {s.point_label: s for s in plan.expand(sc, smoke=True)}
    assert {k: s.config for k, s in smoke.items()} == {k: s.config for k, s in full.items()}
    assert all(smoke[k].fingerprint != full[k].fingerprint for k in full)


def test_interleave_across_scenarios() -> None:
    width = plan.expand(scenario.load(SCENARIOS / "mnist_mlp_width.yaml"), repeats=2)
    gpus = plan.expand(scenario.load(SCENARIOS / "mlp4096_gpus.yaml"), repeats=2)
    ordered = plan.interleave(width + gpus)
    first_rep1 = next(i for i, s in enumerate(ordered) if s.repetition == 1)
    assert first_rep1 == len(width) // 2 + len(gpus) // 2
    assert [s.order for s in ordered] == list(range(len(ordered)))


def test_spec_round_trips_through_json(tmp_path: Path) -> None:
    spec = _specs(tmp_path)[3]
    assert plan.RunSpec.from_dict(spec.to_dict()) == spec


def test_every_spec_carries_the_data_identity_its_data_section_resolves_to(tmp_path: Path) -> None:
    seen: list[dict] = []

    def resolve(data: dict) -> dict:
        seen.append(data)
        return {"source": "idx", "sha256": "ab" * 32, "note": f"for {data.get('data_dir')}"}

    path = write_scenario(tmp_path, "grid", TEXT + "  data.data_dir: /smoke/digits\n")
    specs = plan.expand(scenario.load(path), smoke=True, data=resolve)
    assert all(s.config["data"]["identity"]["sha256"] == "ab" * 32 for s in specs)
    assert {d["data_dir"] for d in seen} == {"/smoke/digits"}, "resolved after the smoke overrides"
    assert all("identity" not in d for d in seen), "the resolver sees the scenario's data section only"


def test_fingerprint_covers_the_identity_but_not_its_note(tmp_path: Path) -> None:
    def fixed(identity: dict):
        return lambda data: dict(identity)

    load = scenario.load(write_scenario(tmp_path, "grid", TEXT))
    real_a = plan.expand(load, data=fixed({"source": "mnist.npz", "sha256": "1" * 64, "note": "/home/a"}))[0]
    real_b = plan.expand(load, data=fixed({"source": "mnist.npz", "sha256": "1" * 64, "note": "/home/b"}))[0]
    other = plan.expand(load, data=fixed({"source": "mnist.npz", "sha256": "2" * 64, "note": "/home/a"}))[0]
    synthetic = plan.expand(load, data=fixed({"source": "synthetic", "note": "no mnist.npz"}))[0]
    assert real_a.fingerprint == real_b.fingerprint
    assert len({real_a.fingerprint, other.fingerprint, synthetic.fingerprint}) == 3
    assert plan.RunSpec.from_dict(real_a.to_dict()) == real_a
