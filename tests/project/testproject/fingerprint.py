"""A request fingerprinter that stalls once (tests/test_feed.py): the first process to
fingerprint a URL containing ``STALL_PATH`` writes its pid to ``STALL_MARKER`` and then blocks its
event loop (time.sleep), as a worker that hangs or dies in the middle of draining the
feed, between taking a batch and queueing it. The test kills it there."""

import os
import time

from scrapy.utils.request import RequestFingerprinter


class StallingFingerprinter(RequestFingerprinter):
    def __init__(self, crawler=None):
        super().__init__(crawler)
        settings = crawler.settings if crawler is not None else {}
        self.path = settings.get("STALL_PATH")
        self.marker = settings.get("STALL_MARKER")

    def fingerprint(self, request):
        if self.path and self.marker and self.path in request.url:
            try:
                os.close(os.open(self.marker + ".lock", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass  # another process stalled already: only the first one does
            else:
                fd = os.open(self.marker + ".tmp", os.O_CREAT | os.O_WRONLY)
                os.write(fd, str(os.getpid()).encode())
                os.close(fd)
                os.rename(self.marker + ".tmp", self.marker)  # the pid, whole
                time.sleep(600)
        return super().fingerprint(request)
