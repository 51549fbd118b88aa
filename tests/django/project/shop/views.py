from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse

from shop.models import Order
from shop.tasks import add, ship


class Refused(Exception):
    pass


def order(request: HttpRequest) -> HttpResponse:
    """Writes an order and enqueues its shipping in one atomic(); ?fail=1 rolls both back. An
    enqueue is the block's first statement too (the harder case: nothing began the transaction
    yet)."""
    ids: dict[str, object] = {}
    try:
        with transaction.atomic():
            ids["first"] = add.enqueue(1, 1).id
            new = Order(name=request.GET.get("name", "x"))
            new.save()
            ids["order"] = new.pk
            ids["task"] = ship.enqueue(new.pk).id
            if request.GET.get("fail"):
                raise Refused
    except Refused:
        return JsonResponse(ids, status=409)
    return JsonResponse(ids)
