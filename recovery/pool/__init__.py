"""The spare pool: which nodes are spares (a reason of ours marks them), which are ready, and
promoting or retiring one as steps written as data (:mod:`.spares`)."""
