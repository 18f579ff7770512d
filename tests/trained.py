"""Running a trainer in a test: `train()` returns TRL's TrainOutput; the tests read every step's metrics."""


def trained(trainer) -> list[dict]:
    """Runs `trainer`; the metrics of each step it ran."""
    trainer.train()
    return trainer.history
