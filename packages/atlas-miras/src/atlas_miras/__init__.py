"""atlas-miras: the MIRAS variants (Behrouz et al., 2025, "It's All Connected") as an atlas_core
plugin, namespace ``miras``.

- ``miras:lp``     attentional bias ``1/p sum |e|^p`` (Moneta), smoothed at e = 0;
- ``miras:huber``  attentional bias, Huber with threshold delta (Yaad);
- ``miras:lq``     retention: lq normalisation of the accumulated update (Moneta);
- ``miras:kl``     retention: KL divergence, a softmax (mirror-descent) update (Memora);
- presets ``miras:moneta``, ``miras:yaad``, ``miras:memora``.

Importing this package does nothing: the components are registered by `atlas_miras.plugin`,
which the plugin host loads through the entry point ``atlas_core.plugins: miras``.
"""

__version__ = "0.1.0"
