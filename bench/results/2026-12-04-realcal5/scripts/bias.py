import random, statistics, sys
import proxy.core.limits as L
from tests.core.test_engine_follow import Toy
for target in (1.0, 2.0, 3.0):
    for transit in (0.05, 0.15, 0.3, 0.6):
        ws = []
        for seed in range(6):
            toy = Toy(8, transit, L.EngineQueueLimit(8, 1, 64, target_waiting=target), random.Random(seed))
            toy.run(1.5 * toy.capacity_rps, 300.0)
            ws.append(toy.mean(1))
        print(f"T {target} transit {transit}: waiting {min(ws):.2f}-{max(ws):.2f}", flush=True)
