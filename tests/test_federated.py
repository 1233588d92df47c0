"""Specification of the utility side: FedAvg over simulated clients under a defense, with
accuracy and macro F1 on a held-out split after every round."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from auditlib.defenses import build_defense
from auditlib.errors import AuditInputError
from auditlib.fl.federated import FederationSpec, evaluate, split_clients, train_federated

torch.set_num_threads(1)


def blobs(n: int, seed: int, classes: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """``classes`` Gaussian clusters in 8 dimensions, as 1 x 2 x 4 images."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, 8, generator=torch.Generator().manual_seed(99)) * 2
    labels = torch.arange(n) % classes
    points = centres[labels] + torch.randn(n, 8, generator=g)
    return points.view(n, 1, 2, 4), labels


def linear_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(8, 4))


FEDERATION = FederationSpec(clients=5, rounds=6, local_lr=0.1, local_batch_size=16)


def history(defense: str = "none", params=None, federation=FEDERATION, seed: int = 0):
    model = linear_model(seed)
    rounds = list(
        train_federated(
            model, blobs(400, 1), blobs(200, 2), federation, build_defense(defense, params)[0]
        )
    )
    return model, rounds


# --- client splits ------------------------------------------------------------------------------


def test_iid_split_is_a_partition_into_near_equal_parts():
    labels = np.arange(103) % 10
    parts = split_clients(labels, 10, "iid", 0.5, seed=0)
    assert sorted(np.concatenate(parts).tolist()) == list(range(103))
    assert {len(p) for p in parts} == {10, 11}


def test_dirichlet_split_is_a_partition_skewed_by_alpha():
    labels = np.repeat(np.arange(10), 100)

    def skew(parts):  # mean share of a client's most common class
        return np.mean([np.bincount(labels[p], minlength=10).max() / len(p) for p in parts])

    skewed = split_clients(labels, 10, "dirichlet", 0.1, seed=0)
    mild = split_clients(labels, 10, "dirichlet", 100.0, seed=0)
    for parts in (skewed, mild):
        assert sorted(np.concatenate(parts).tolist()) == list(range(1000))
        assert all(len(p) > 0 for p in parts)
    assert skew(skewed) > 0.5
    assert skew(mild) < 0.25
    iid = split_clients(labels, 10, "iid", 0.1, seed=0)
    assert skew(iid) < skew(skewed)


def test_splits_are_fixed_by_the_seed():
    labels = np.arange(200) % 5
    a = split_clients(labels, 4, "dirichlet", 0.5, seed=3)
    b = split_clients(labels, 4, "dirichlet", 0.5, seed=3)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_split_refuses_more_clients_than_examples():
    with pytest.raises(AuditInputError, match="cannot be split over 10 clients"):
        split_clients(np.arange(5), 10, "iid", 0.5, seed=0)


@pytest.mark.parametrize(
    "params, message",
    [
        ({"clients": 0}, "clients must be in"),
        ({"clients": 4, "clients_per_round": 5}, "clients per round"),
        ({"split": "shards"}, "split"),
        ({"alpha": 0}, "alpha"),
        ({"local_lr": -1}, "learning rate"),
        ({"rounds": -1}, "rounds"),
    ],
)
def test_federation_settings_are_validated(params, message):
    with pytest.raises(AuditInputError, match=message):
        FederationSpec(**params)


# --- training and utility ---------------------------------------------------------------------


def test_federated_training_raises_accuracy_and_reports_every_round():
    model, rounds = history()
    assert [r.round for r in rounds] == list(range(7))
    assert rounds[0].train_loss is None and rounds[0].seconds == 0
    assert rounds[-1].accuracy > 0.9
    assert rounds[-1].accuracy > rounds[0].accuracy + 0.3
    assert rounds[-1].macro_f1 > 0.9
    assert rounds[-1].train_loss < rounds[1].train_loss
    # The model is left trained, at the last round: its own evaluation agrees.
    assert evaluate(model, *blobs(200, 2)) == (rounds[-1].accuracy, rounds[-1].macro_f1)


def test_stopping_early_leaves_the_model_at_that_round():
    model = linear_model()
    run = train_federated(model, blobs(400, 1), blobs(200, 2), FEDERATION, build_defense("none")[0])
    at_two = [next(run) for _ in range(3)][-1]
    assert at_two.round == 2
    assert evaluate(model, *blobs(200, 2))[0] == at_two.accuracy


def test_training_is_fixed_by_the_seeds():
    first = [(r.accuracy, r.train_loss) for r in history("dp-gaussian", {"sigma": 0.05})[1]]
    again = [(r.accuracy, r.train_loss) for r in history("dp-gaussian", {"sigma": 0.05})[1]]
    assert first == again


def test_strong_noise_costs_accuracy_that_no_defense_keeps():
    clean = history()[1][-1].accuracy
    noisy = history("dp-gaussian", {"sigma": 3.0})[1][-1].accuracy
    assert noisy < clean - 0.2


def test_partial_participation_and_non_iid_still_train():
    federation = FederationSpec(
        clients=8, clients_per_round=3, split="dirichlet", alpha=0.3, rounds=8, local_lr=0.1
    )
    rounds = history(federation=federation)[1]
    assert rounds[-1].accuracy > rounds[0].accuracy + 0.2


def test_macro_f1_counts_every_class_of_the_test_split():
    model = nn.Sequential(nn.Flatten(), nn.Linear(8, 4))
    with torch.no_grad():
        model[1].weight.zero_()
        model[1].bias.copy_(torch.tensor([1.0, 0, 0, 0]))  # always predicts class 0
    accuracy, macro_f1 = evaluate(model, *blobs(200, 2))
    assert accuracy == pytest.approx(0.25)
    # F1 of class 0 is 2 * 0.25 / 1.25 = 0.4; the other three classes score 0.
    assert macro_f1 == pytest.approx(0.1)


def test_a_defense_that_needs_the_client_batch_works_in_training():
    rounds = history("soteria", {"ratio": 0.5})[1]
    assert rounds[-1].accuracy > rounds[0].accuracy


# --- utility data and the command line ----------------------------------------------------------


def test_digits_train_and_test_parts_are_disjoint_and_seeded():
    from auditlib.data.training_sets import bundled_sets

    sets = bundled_sets("digits", 300, 100, seed=4)
    assert len(sets.train_images) == 300 and len(sets.test_labels) == 100
    train = {
        img.tobytes() + bytes([int(y)])
        for img, y in zip(sets.train_images, sets.train_labels, strict=False)
    }
    test = {
        img.tobytes() + bytes([int(y)])
        for img, y in zip(sets.test_images, sets.test_labels, strict=False)
    }
    # Digits holds a few exact duplicates; disjoint positions leave almost all apart.
    assert len(train & test) <= 2
    again = bundled_sets("digits", 300, 100, seed=4)
    assert np.array_equal(sets.train_labels, again.train_labels)
    with pytest.raises(AuditInputError, match="1797 labelled examples"):
        bundled_sets("digits", 1700, 200, seed=0)
    with pytest.raises(AuditInputError, match="cannot train a model"):
        bundled_sets("photographs", 10, 10, seed=0)


def test_own_images_need_labels_to_measure_utility():
    from auditlib.data.images import LabelledImages
    from auditlib.data.training_sets import labelled_sets

    pixels = tuple(np.zeros((8, 8, 1), np.uint8) for _ in range(10))
    names = tuple(f"{i}.png" for i in range(10))
    with pytest.raises(AuditInputError, match="has no labels"):
        labelled_sets(LabelledImages(pixels, names, None, None, "upload"), 0.2, seed=0)
    labelled = LabelledImages(pixels, names, tuple(i % 2 for i in range(10)), None, "upload")
    sets = labelled_sets(labelled, 0.2, seed=0)
    assert (len(sets.train_labels), len(sets.test_labels)) == (8, 2)


def test_utility_command_trains_and_writes_every_round(tmp_path, capsys):
    import json

    from auditlib.cli import main

    out = tmp_path / "utility.json"
    args = "utility --model mlp --activation relu --channels 1 --input-size 8 --samples digits "
    args += "--train 400 --test 200 --clients 4 --rounds 3 --local-epochs 3 --local-lr 0.3 --local-batch-size 16 "
    args += f"--defense quantize --defense-param bits=8 --out {out}"
    assert main(args.split()) == 0
    written = json.loads(out.read_text())
    assert [r["round"] for r in written["rounds"]] == [0, 1, 2, 3]
    assert written["rounds"][-1]["accuracy"] > written["rounds"][0]["accuracy"] + 0.2
    assert written["defense"] == {
        "name": "quantize",
        "settings": {"bits": 8, "stochastic": True, "bucket_size": 512},
    }
    assert "round   3: accuracy" in capsys.readouterr().out


def test_utility_command_explains_bad_input(capsys):
    from auditlib.cli import main

    args = "utility --model mlp --channels 1 --input-size 8 --samples digits --clients 0"
    assert main(args.split()) == 2
    assert "clients must be in [1, 1000]" in capsys.readouterr().err
