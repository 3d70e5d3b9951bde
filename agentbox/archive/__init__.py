"""The archive of exports: the bytes each review heard, kept in the data directory
(content-addressed: the same audio twice is kept once), so that any export of a
project can be played again and two of them heard side by side, whatever the DAW
did to its file since; and each project's reference track.

    blobs   the files: copied as a review reads them, named by their SHA-256
    keeper  the Archive the app owns: keeping, and finding the bytes to play
"""

from agentbox.archive.keeper import Archive, Gone, Playable, Reviewed

__all__ = ["Archive", "Gone", "Playable", "Reviewed"]
