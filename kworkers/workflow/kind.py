"""What an activity of a workflow is: one of its steps, or a step's compensation.

A module of its own so that the step context (``context``) and the definitions
(``definition``), which name each other, both depend on it rather than on each other.
"""

from __future__ import annotations

from typing import Literal

Kind = Literal["step", "compensation"]
