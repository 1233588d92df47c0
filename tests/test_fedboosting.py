"""Specification of FedBoosting's protocol (thesis chapter 4): Paillier aggregation of
quantised updates, the DP-fusion weights, the boosting weights, and what a curious partner
recovers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from auditlib.client.paillier import PaillierChannel, integer_weights
from auditlib.client.protocol import ClientProtocol
from auditlib.defenses import build_defense
from auditlib.defenses.fedboosting import boosting_weights, fusion_weights, recover_fusion_weights
from auditlib.errors import AttackUnsupportedError, AuditInputError
from auditlib.fl.training import fedavg_round

torch.set_num_threads(1)


def updates(count: int, seed: int = 0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(3, 4, generator=g, dtype=dtype), torch.randn(5, generator=g, dtype=dtype))
        for _ in range(count)
    ]


def weighted_sum(weights, parts, pieces):
    return [sum(w / pieces * p[k] for w, p in zip(weights, parts, strict=True)) for k in range(2)]


def test_encrypted_aggregation_decrypts_to_the_plain_weighted_sum():
    channel = PaillierChannel(key_bits=128, scale=1e32, pieces=100)
    parts = updates(3)
    weights = integer_weights([0.5, 0.3, 0.2], 100)
    assert weights == [50, 30, 20]
    encrypted = [channel.encrypt(channel.quantise(u, sum(weights))) for u in parts]
    total = channel.dequantise(channel.decrypt(channel.combine(weights, encrypted)), parts[0])
    for got, want in zip(total, weighted_sum(weights, parts, 100), strict=True):
        assert torch.allclose(got, want, rtol=1e-12, atol=1e-15)
    # What the server holds are ciphertexts: not the integers, and never equal for equal values.
    assert encrypted[0][0].ciphertext() != channel.quantise(parts[0], 100)[0]
    again = channel.public_key.encrypt(7)
    assert again.ciphertext() != channel.public_key.encrypt(7).ciphertext()
    assert channel.cost.values_encrypted == 3 * 17
    assert channel.cost.ciphertext_bytes == 3 * 17 * 32  # integers mod n^2, n of 128 bits


def test_the_error_is_the_quantisation_error():
    # A coarse scale makes the rounding visible: each value is off by at most
    # sum(weights) * 0.5 / scale, and is off by something.
    channel = PaillierChannel(key_bits=128, scale=1e4, pieces=100)
    parts = updates(2, seed=1)
    weights = [60, 40]
    encrypted = [channel.encrypt(channel.quantise(u, 100)) for u in parts]
    total = channel.dequantise(channel.decrypt(channel.combine(weights, encrypted)), parts[0])
    error = torch.cat(
        [(g - w).flatten() for g, w in zip(total, weighted_sum(weights, parts, 100), strict=True)]
    )
    assert error.abs().max() <= sum(weights) * 0.5 / 1e4
    assert error.abs().max() > 0


def test_values_too_large_for_the_key_are_refused():
    channel = PaillierChannel(key_bits=128, scale=1e32, pieces=100)
    # 1e8 x 1e32 / 100 x a weight sum of 100 = 1e40: over any 128-bit key's max_int (n / 3 <
    # 1.2e38). 1e6 gave 1e38, under max_int for some of phe's random keys (a flaky test).
    with pytest.raises(AuditInputError, match="overflows a 128-bit Paillier key"):
        channel.quantise((torch.tensor([1e8]),), 100)
    with pytest.raises(AuditInputError, match="NaN"):
        channel.quantise((torch.tensor([float("nan")]),), 100)


def test_fusion_and_boosting_weights():
    assert fusion_weights(3, 0.9, 100).tolist() == [[90, 5, 5], [5, 90, 5], [5, 5, 90]]
    assert fusion_weights(2, 0.9, 100).tolist() == [[90, 10], [10, 90]]
    validation = np.array([[0.5, 0.5], [1.0, 1.0]])  # model 0 generalises better
    p = boosting_weights([1.0, 1.0], validation)
    assert p.sum() == pytest.approx(1.0) and p[0] == pytest.approx(2 / 3)
    p = boosting_weights([0.5, 1.0], np.ones((2, 2)))  # ... or fits its data better
    assert p[0] == pytest.approx(2 / 3)


def client_data(seed: int):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(10, 1, 4, 4, generator=g), torch.randint(0, 3, (10,), generator=g))
        for _ in range(3)
    ]


def small_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 3))


def test_a_boosted_round_is_the_same_encrypted_or_not():
    protocol = ClientProtocol("fedavg", local_epochs=1, local_lr=0.1, local_batch_size=4)
    results = []
    for encrypt in (True, False):
        model = small_model()
        defense, _ = build_defense("fedboosting", {"encrypt": encrypt})
        fedavg_round(
            model, client_data(0), protocol, defense, generator=torch.Generator().manual_seed(0)
        )
        results.append((model, defense.rounds[0]))
    (encrypted, log), (plain, plain_log) = results
    for a, b in zip(encrypted.parameters(), plain.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    assert log["integer_weights"] == plain_log["integer_weights"]
    assert sum(log["boosting_weights"]) == pytest.approx(1.0)
    assert log["ciphertext_bytes"] == 8 * log["plaintext_bytes"]  # 32 vs 4 bytes a value
    assert "ciphertext_bytes" not in plain_log
    # The boosting weights differ from the example-count weights FedAvg would use.
    fedavg = small_model()
    none, _ = build_defense("none")
    fedavg_round(fedavg, client_data(0), protocol, none, generator=torch.Generator())
    assert not all(
        torch.allclose(a, b, atol=1e-6)
        for a, b in zip(plain.parameters(), fedavg.parameters(), strict=True)
    )


def test_a_client_too_small_to_hold_out_is_refused():
    protocol = ClientProtocol("fedavg", local_lr=0.1)
    defense, _ = build_defense("fedboosting", {"encrypt": False})
    one = [(torch.randn(1, 1, 4, 4), torch.tensor([0]))]
    with pytest.raises(AuditInputError, match="at least 2 examples"):
        fedavg_round(small_model(), one, protocol, defense, generator=torch.Generator())


def recovered_matches(recovered, update) -> bool:
    return all(
        got.dtype == want.dtype and torch.allclose(got, want, rtol=1e-6)
        for got, want in zip(recovered, update, strict=True)
    )


def test_the_curious_partner_finds_the_private_fusion_weights_and_the_update():
    update = updates(1, seed=3, dtype=torch.float32)[0]
    defense, _ = build_defense("fedboosting")  # private weights drawn by the server
    assert all(torch.equal(a, b) for a, b in zip(defense.apply(update, None), update, strict=True))
    assert defense.audit_cost is None  # the client's own step encrypts nothing in an audit
    recovered = defense.attacker_view(update, torch.Generator().manual_seed(0))
    assert recovered_matches(recovered, update)
    record = defense.audit_record
    assert record["weights_found"] and record["partner_used"] == record["fusion_weights"]
    assert 90 <= record["fusion_weights"][0] <= 100  # p^ drawn in [fused_share, 1]
    report = defense.privacy_report()
    assert report["epsilon"] is None and "finding the fusion weights" in report["attacker"]
    assert report["cost"]["values_encrypted"] == 2 * 17
    with pytest.raises(AuditInputError, match="fused_share"):
        build_defense("fedboosting", {"fused_share": 0.4})
    with pytest.raises(AuditInputError, match="key_bits"):
        build_defense("fedboosting", {"key_bits": 100})
    with pytest.raises(AuditInputError, match="view='clients' is not one of client, server"):
        build_defense("fedboosting", {"view": "clients"})


@pytest.mark.parametrize("share", [0.55, 0.75, 0.9, 0.99, 1.0])
def test_every_fusion_share_is_found_from_the_integers(share):
    # Drawn or fixed, the weights are integers of at most P, and only the right weight of the
    # partner's own share leaves the victim's weight as a common divisor.
    channel = PaillierChannel(key_bits=128, scale=1e32, pieces=100)
    victim, partner = (channel.quantise(u, 100) for u in updates(2, seed=5))
    a, b = round(share * 100), round((1 - share) * 100)
    fused = [a * v + b * p for v, p in zip(victim, partner, strict=True)]
    assert recover_fusion_weights(fused, partner, 100) == (a, b)


def test_leaked_weights_give_the_same_update_as_found_ones():
    update = updates(1, seed=6, dtype=torch.float32)[0]
    found, _ = build_defense("fedboosting", {"fused_share": 0.6})
    leaked, _ = build_defense("fedboosting", {"fused_share": 0.6, "weights_leaked": True})
    for defense in (found, leaked):
        assert recovered_matches(defense.attacker_view(update, torch.Generator()), update)
    assert not leaked.audit_record["weights_found"]
    assert "handed the fusion weights" in leaked.privacy_report()["attacker"]


def test_the_server_factors_the_thesis_128_bit_key_and_reads_the_update():
    update = updates(1, seed=7, dtype=torch.float32)[0]
    defense, _ = build_defense("fedboosting", {"view": "server"})
    recovered = defense.attacker_view(update, torch.Generator())
    assert recovered_matches(recovered, update)
    assert defense.audit_cost["factor_s"] > 0
    assert "factors the 128-bit public key" in defense.privacy_report()["attacker"]


def test_the_server_view_with_a_key_it_cannot_factor_is_not_an_attack():
    defense, _ = build_defense("fedboosting", {"view": "server", "key_bits": 256})
    with pytest.raises(AttackUnsupportedError, match="no gradient attack applies to the server"):
        defense.attacker_view(updates(1)[0], torch.Generator())


def test_training_losses_are_taken_after_local_training():
    # Alg. 2, line 19: T_i = f(TrnD_i | w_r), the client's loss at its trained weights.
    protocol = ClientProtocol("fedavg", local_epochs=1, local_lr=0.5, local_batch_size=9)
    model, clients = small_model(), client_data(1)
    with torch.no_grad():  # each client's training split (the first 9 of 10) at the start
        before = [float(F.cross_entropy(model(x[:9]), y[:9])) for x, y in clients]
    defense, _ = build_defense("fedboosting", {"encrypt": False})
    fedavg_round(model, clients, protocol, defense, generator=torch.Generator().manual_seed(0))
    after = defense.rounds[0]["train_losses"]
    assert all(t < b for t, b in zip(after, before, strict=True))
    fusion = np.array(defense.rounds[0]["fusion_weights"])
    assert ((np.diag(fusion) >= 90) & (np.diag(fusion) <= 100)).all()


def test_an_audit_observes_what_the_partner_decrypts():
    from auditlib.data.normalization import Normalization
    from auditlib.fl.scenario import release_update
    from auditlib.threat import PrivateBatch

    g = torch.Generator().manual_seed(4)
    batch = PrivateBatch(torch.randn(2, 1, 4, 4, generator=g), torch.tensor([0, 2]), ("a", "b"))
    releases = {}
    for name in ("none", "fedboosting"):
        releases[name] = release_update(
            small_model(),
            batch,
            ClientProtocol(),
            build_defense(name)[0],
            normalization=Normalization.parse("none", 1),
            num_classes=3,
            labels_known=False,
            seed=0,
        )
    plain, fused = releases["none"].observation, releases["fedboosting"].observation
    for a, b in zip(plain.tensors, fused.tensors, strict=True):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-9)
    assert releases["fedboosting"].privacy["cost"]["values_encrypted"] > 0
