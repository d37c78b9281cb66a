"""Reports for people, pure functions of records: the ``peerwatch job`` summary
(:mod:`.job_summary`, its checked inputs :mod:`.job_inputs`, the owner's advice :mod:`.advice`)
and the network line of a job's nodes (:mod:`.network`). No I/O, no clock: the commands read the
records and render the result (``peerwatch/job_view.py``, ``exporters/report.py``)."""
