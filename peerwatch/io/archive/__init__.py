"""The archive: Avro object container files per topic and event hour, the one format that
``peerwatch archive`` writes and replay, ``peerwatch job --archive``, the simulator and the
benchmark read and write. :mod:`.layout` names and lists the files, :mod:`.reader` reads them,
:mod:`.writer` writes them."""
