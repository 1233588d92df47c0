"""The client: its protocol, its one update, a round as the server sees it, FedAvg, Paillier."""
