"""An order saga: charge card -> reserve stock -> ship; when shipping fails for good, the
engine releases the stock and refunds the card (in that order). ``python -m examples.order_saga``.
"""
