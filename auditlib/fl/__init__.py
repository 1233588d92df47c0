"""The federation: a round as the server sees it, where the client applies its defense
(``scenario.py``), FedAvg rounds and the attack stage's pretraining (``training.py``), the
utility training (``federated.py``). It imports the defenses; what the defenses and attacks
need of the client (its protocol, its update, Paillier) is below both, in
:mod:`auditlib.client`."""
