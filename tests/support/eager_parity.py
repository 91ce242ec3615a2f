"""The dygraph parity check: each rank trained beside a plain-Paddle reference on the full batch
in one process and reported `losses` (its shard's), `reference_losses`, `param_diff` and
`eval_diff` (largest differences from the reference) and a `digest` of its trained state."""
import numpy as np


def assert_ranks_train_like_the_reference(ranks, tolerance):
    mean_loss = np.mean([rank["losses"] for rank in ranks], axis=0)
    np.testing.assert_allclose(mean_loss, ranks[0]["reference_losses"], rtol=0, atol=tolerance)
    for rank, result in enumerate(ranks):
        assert result["param_diff"] <= tolerance, f"rank {rank}: eager state {result['param_diff']} off"
        assert result["eval_diff"] <= tolerance, f"rank {rank}: eager eval output {result['eval_diff']} off"
    assert len({rank["digest"] for rank in ranks}) == 1, "the ranks' eager models differ"
