"""Command-line parsing shared by the demo (cifar10_PM.py) and `python -m workspace`: a parser whose errors are one
line naming the flag, and an unknown value of a flag with fixed choices answered with the few nearest choices."""

from __future__ import annotations

import argparse

from audit import did_you_mean

__all__ = ["SuggestingParser", "NEAREST"]

NEAREST = 3  # how many near names a "did you mean" offers
LISTED_CHOICES = 12  # an error lists a flag's choices up to this many; beyond, it says how many and offers the nearest


class SuggestingParser(argparse.ArgumentParser):
    """argparse's parser, whose "invalid choice" (a --model, --dataset, ... value, a subcommand) adds the nearest
    choices: "invalid choice: 'fcn' (choose from 'cnn', 'fcnn', 'alexnet'); did you mean fcnn or cnn?"."""

    def _check_value(self, action, value):
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as err:
            hint = did_you_mean(value, action.choices or (), count=NEAREST) if isinstance(value, str) else ""
            if not hint:
                raise
            message = err.message
            if len(action.choices) > LISTED_CHOICES:  # argparse would list them all (every torchvision model)
                message = f"invalid choice: {value!r} (one of {len(action.choices)} names)"
            raise argparse.ArgumentError(action, message + hint) from None
