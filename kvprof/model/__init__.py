"""The profile model: plain dataclasses between the collectors and every view.

Nothing here imports bcc or textual; everything downstream of the model is
testable without root, from recorded profiles.
"""
