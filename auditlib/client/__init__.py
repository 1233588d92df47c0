"""What one client computes and sends: its protocol (``protocol.py``), its one update,
shared by the victim and every attacker (``update.py``), and the Paillier encryption of
FedBoosting's secure aggregation (``paillier.py``).

Below the defenses and the attacks, which both use it, and below the federation
(``auditlib.fl``), which applies the defenses: it imports none of them (pyproject.toml's
import-linter contracts).
"""
