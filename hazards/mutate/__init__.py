"""`hazards mutate`: would a stress test see a missing fence?

Synchronization mutants of a source (`operators`, `mutants`), built in scratch copies and
killed by the static checks or by the engine running the user's test (`kill`)."""
