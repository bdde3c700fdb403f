"""Writing datasets: ``pack`` (an ImageFolder into tar shards) and ``index_dataset``.

The packer (:mod:`._pack`), where it writes (:mod:`._packsink`), the images it checks and
converts (:mod:`._images`), and the indexer that writes asyncstream's manifest for shards
written elsewhere (:mod:`._indexer`).

Layer: stands on :mod:`asyncstream.dataset` and below; independent of the stream.
"""
