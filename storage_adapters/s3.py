"""An S3 bucket (any S3-compatible endpoint), one object per key, fenced by conditional writes.

The object ``<prefix><key>`` holds the value byte for byte, with its content
type as the object's ``Content-Type`` and fencing state in user metadata::

    x-amz-meta-fencegate-token    token of the last accepted write (absent: unfenced write)
    x-amz-meta-fencegate-mark     high-water mark of the key (writes and fenced reads raise it)
    x-amz-meta-fencegate-deleted  "true" on a tombstone: the key is deleted (the body says so)

There is no other database: every change is one conditional write of the
object (``If-Match: <ETag read>``, or ``If-None-Match: *`` when there is no
object), so the mark check and the write are one atomic step at the server::

    HEAD/GET -> (etag, mark); refuse if token < mark; PUT ... If-Match: etag
    another writer changed the object in between -> 412 (or 409): read again, bounded retries

* a fenced read whose token is above the mark writes the same body back with
  the raised mark (``If-Match``), so a fenced read costs a write of the body;
* a delete leaves a tombstone that keeps the mark (a real DELETE would forget
  it and let an older token create the key again); reads answer 404 for it.
  Only a key that was never fenced is really deleted (a conditional DELETE).

The fence scope is the key itself: the object is the only thing a conditional
write can check, so a coarser lock (``X-Fencing-Lock``) cannot be fenced here.

Known limit, from how S3 computes ETags: the ETag of a plain PUT is the MD5 of
the body, so it does not change when only metadata changes. A writer that read
ETag E and is paused *between its read and its PUT* (milliseconds) still
passes ``If-Match: E`` if, meanwhile, newer tokens only raised the mark (a
fenced read, a same-body write) or wrote a body and then the same old body
back. A pause before the read, however long, is refused. See README, "s3".

The requests themselves (HEAD, GET, conditional PUT and DELETE, the metadata and
the mapping of S3 errors) are ``S3Objects`` in ``storage_adapters/s3_objects.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import secrets
from typing import TYPE_CHECKING, Final

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import ClientError

from storage_adapters.base import NO_HOOKS, Record, StoreHooks
from storage_adapters.errors import (
    BadValue,
    NotFound,
    StaleToken,
    StorageError,
    StorageUnavailable,
    StoreMisconfigured,
)
from storage_adapters.s3_objects import LostRace, ObjectInfo, S3Objects, error_status

if TYPE_CHECKING:
    from types_aiobotocore_s3 import S3Client

__all__ = ["MAX_ATTEMPTS", "S3Store"]

MAX_ATTEMPTS: Final = 10
"""Conditional writes tried per operation before it fails with 503 (a lost race each time)."""
_MAX_OBJECT_KEY: Final = 1024  # bytes, S3's limit
_PROBE: Final = ".fencegate@probe/"
_NO_ETAG: Final = '"00000000000000000000000000000000"'


class S3Store(S3Objects):
    """Objects in one bucket, one per key, each fenced by conditional writes.

    Args:
        name: the store name.
        bucket: an existing bucket.
        endpoint: the S3-compatible endpoint URL; None for AWS.
        region: the signing region.
        prefix: prepended to every key to name its object.
        access_key_id, secret_access_key: credentials; None for the standard AWS
            chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, profiles, ...).
        timeout: seconds one S3 request may take.
        max_attempts: conditional writes tried per operation (lost races).
        hooks: metrics hooks.
    """

    kind = "s3"
    per_key_scope = True

    def __init__(
        self,
        name: str,
        *,
        bucket: str,
        endpoint: str | None = None,
        region: str = "us-east-1",
        prefix: str = "",
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        timeout: float = 10.0,
        max_attempts: int = MAX_ATTEMPTS,
        hooks: StoreHooks = NO_HOOKS,
    ) -> None:
        super().__init__(name, hooks=hooks)
        self.bucket = bucket
        self.endpoint = endpoint
        self.region = region
        self.prefix = prefix
        self._access_key_id = access_key_id
        self._secret_access_key = secret_access_key
        self._timeout = timeout
        self._max_attempts = max_attempts
        self._stack: contextlib.AsyncExitStack | None = None
        self._client: S3Client | None = None

    def check_key(self, key: str) -> None:
        super().check_key(key)
        if len((self.prefix + key).encode()) > _MAX_OBJECT_KEY:
            raise BadValue(
                f"key {key!r} with prefix {self.prefix!r} is longer than S3's"
                f" {_MAX_OBJECT_KEY} bytes",
                key=key,
            )

    def _check(self, scope: str, key: str, token: int | None) -> None:
        super()._check(scope, key, token)
        self.check_key(key)
        if token is not None and scope != f"{self.name}/{key}":
            raise BadValue(
                f"store {self.name!r} (s3) fences each key by its own lock"
                f" {self.name + '/' + key!r}, not {scope!r}: a conditional write checks one object"
            )

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        if self._client is not None:
            return
        stack = contextlib.AsyncExitStack()
        config = AioConfig(
            connect_timeout=min(self._timeout, 5.0),
            read_timeout=self._timeout,
            retries={"total_max_attempts": 1},  # our loop retries; an outage answers 503 at once
            s3={"addressing_style": "auto" if self.endpoint is None else "path"},
            # S3-compatible servers differ in the newer checksum headers; send them when required
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        try:
            client = await stack.enter_async_context(
                get_session().create_client(
                    "s3",
                    endpoint_url=self.endpoint,
                    region_name=self.region,
                    aws_access_key_id=self._access_key_id,
                    aws_secret_access_key=self._secret_access_key,
                    config=config,
                )
            )
            self._client = client
            await self._check_bucket()
            await self._check_conditional_writes()
        except BaseException:
            self._client = None
            await stack.aclose()
            raise
        self._stack = stack

    async def _check_bucket(self) -> None:
        try:
            async with self._errors("HeadBucket", start=True):
                await self._require_client().head_bucket(Bucket=self.bucket)
        except StorageUnavailable as exc:
            cause = exc.__cause__
            if isinstance(cause, ClientError) and error_status(cause) == 404:
                where = f"bucket {self.bucket!r} at {self.endpoint or 'AWS'}"
                raise StoreMisconfigured(self.name, f"{where} does not exist") from None
            raise

    async def _check_conditional_writes(self) -> None:
        """Refuse a server that ignores If-None-Match or If-Match on PutObject.

        Such a server would accept every write and fence nothing. The probe is an
        object under ``prefix + _PROBE`` (no key can name it: ``@`` is not in keys).
        """
        name = f"{self.prefix}{_PROBE}{secrets.token_hex(8)}"
        client = self._require_client()
        try:
            async with self._errors("PutObject", start=True):
                await client.put_object(Bucket=self.bucket, Key=name, Body=b"1", IfNoneMatch="*")
            for header in ("If-None-Match", "If-Match"):
                if await self._probe_refused(name, header):
                    continue  # as it must be
                raise StoreMisconfigured(
                    self.name,
                    f"the server at {self.endpoint or 'AWS'} ignores {header} on PutObject"
                    " (a probe write that must fail succeeded): without conditional writes"
                    " it cannot fence; use a server that supports them",
                )
        finally:
            with contextlib.suppress(StorageError):
                async with self._errors("DeleteObject"):
                    await client.delete_object(Bucket=self.bucket, Key=name)

    async def _probe_refused(self, name: str, header: str) -> bool:
        """Whether a write that must fail (``header`` does not hold) was refused."""
        client = self._require_client()
        try:
            async with self._errors("PutObject", conditional=True, start=True):
                if header == "If-None-Match":
                    await client.put_object(
                        Bucket=self.bucket, Key=name, Body=b"2", IfNoneMatch="*"
                    )
                else:
                    await client.put_object(
                        Bucket=self.bucket, Key=name, Body=b"2", IfMatch=_NO_ETAG
                    )
        except LostRace:
            return True
        return False

    async def close(self) -> None:
        stack, self._stack, self._client = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    async def ping(self) -> None:
        async with self._errors("HeadBucket"):
            await self._require_client().head_bucket(Bucket=self.bucket)

    # -- the three operations ----------------------------------------------------------

    async def _put(
        self, scope: str, key: str, token: int | None, body: bytes, content_type: str
    ) -> int | None:
        name = self.prefix + key
        for attempt in range(self._max_attempts):
            current = await self._head(name)
            mark = self._checked_mark(scope, current, token)
            try:
                await self._write(
                    name, current, body, content_type, token=token, mark=max(mark, token or 0)
                )
                return token
            except LostRace:
                await _backoff(attempt)
        raise self._contended(key)

    async def _get(self, scope: str, key: str, token: int | None) -> Record:
        name = self.prefix + key
        for attempt in range(self._max_attempts):
            current = await self._fetch(name)
            mark = self._checked_mark(scope, current, token)
            try:
                if token is not None and token > mark:
                    if current is None or current.deleted:
                        await self._tombstone(name, current, mark=token)
                    else:  # the same body back, with the raised mark
                        await self._write(
                            name,
                            current,
                            current.body,
                            current.content_type,
                            token=current.token,
                            mark=token,
                        )
            except LostRace:
                await _backoff(attempt)
                continue
            if current is None or current.deleted:
                raise NotFound(self.name, key)
            return Record(body=current.body, token=current.token, content_type=current.content_type)
        raise self._contended(key)

    async def _delete(self, scope: str, key: str, token: int | None) -> None:
        name = self.prefix + key
        for attempt in range(self._max_attempts):
            current = await self._head(name)
            mark = max(self._checked_mark(scope, current, token), token or 0)
            try:
                if mark == 0:  # never fenced: nothing to remember, really delete it
                    if current is not None:
                        await self._delete_object(name, current.etag)
                    return
                if current is None or not current.deleted or current.mark < mark:
                    await self._tombstone(name, current, mark=mark)
                return
            except LostRace:
                await _backoff(attempt)
        raise self._contended(key)

    # -- fencing -----------------------------------------------------------------------

    def _checked_mark(self, scope: str, current: ObjectInfo | None, token: int | None) -> int:
        """The mark of the object; raise ``StaleToken`` if ``token`` is older."""
        mark = 0 if current is None else current.mark
        if token is not None and token < mark:
            raise StaleToken(token, mark, scope=scope)
        return mark

    def _contended(self, key: str) -> StorageUnavailable:
        return StorageUnavailable(
            self.name,
            f"key {key!r} changed under {self._max_attempts} conditional writes in a row"
            " (other writers of the key); try again",
        )


async def _backoff(attempt: int) -> None:
    """A short random pause before trying a lost conditional write again (bounded)."""
    await asyncio.sleep(random.uniform(0, min(0.005 * 2**attempt, 0.2)))
