"""A claiming worker for the concurrency test: ``python -m tests.support.claimer URL TOKEN NAME OUT SEED``.

Registers as worker NAME, claims until the queue stays empty, and writes the
claimed tasks to OUT as JSON lines (task id, campaign id, realisation index).
"""

from __future__ import annotations

import json
import random
import sys

import httpx


def main() -> None:
    api_url, token, name, out, seed = sys.argv[1:6]
    rng = random.Random(int(seed))
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as client:
        worker = client.post("/workers", json={"name": name, "site": "local", "host": name, "capacity": 3})
        worker.raise_for_status()
        worker_id = worker.json()["id"]
        empty = 0
        with open(out, "w") as handle:
            while empty < 3:
                answer = client.post(f"/workers/{worker_id}/claim", json={"max_tasks": rng.randint(1, 3)})
                answer.raise_for_status()
                tasks = answer.json()["tasks"]
                empty = 0 if tasks else empty + 1
                handle.writelines(json.dumps(
                            {
                                "task_id": task["task_id"],
                                "kind": task["kind"],
                                "campaign_id": task.get("campaign_id"),
                                "realization": task.get("realization"),
                            }
                        )
                        + "\n" for task in tasks)


if __name__ == "__main__":
    main()
