"""The lessons layer: one toolkit per notebook topic, the widgets, and the checked exercises.

Contract: composes the layers below into what a notebook calls in one short cell, and checks what a
lesson claims against the real server. The top of the package: anything may be imported from here,
nothing below imports it.
"""
