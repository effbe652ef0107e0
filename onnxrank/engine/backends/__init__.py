"""Inference runtimes behind one interface: one module per backend (see base.Backend)."""
