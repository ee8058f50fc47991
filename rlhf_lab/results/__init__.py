"""Results: what the lab reads out of finished runs to answer a campaign's question — which
runs a comparison takes, their held-out numbers and how they are framed. Torch-free. (The older
result modules, ``rlhf_lab.compare``, ``rlhf_lab.headline`` and ``rlhf_lab.stats``, still live at
the package's top level.)"""
