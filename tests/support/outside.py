"""An item class outside the test project's modules (tests/project/testproject): a
worker must refuse to store it in meta, and to rebuild it from Redis."""

import dataclasses


@dataclasses.dataclass
class OutsideItem:
    n: int = 0
