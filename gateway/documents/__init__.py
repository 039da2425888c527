"""The document API: search without generation, and upload, list, get and delete."""
