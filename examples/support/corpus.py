"""The help center the support example retrieves from, and the accounts and tickets it serves.

Every article has an id, a language and the day it was last edited (days before ANCHOR); the
refund policy was rewritten 5 days before ANCHOR, so a ticket answered before then retrieves the
old text and one answered after it the new (point in time).
"""

from datetime import UTC, datetime, timedelta
from typing import Any

ANCHOR = datetime(2026, 11, 30, 12, tzinfo=UTC)

# (id, lang, days before ANCHOR, title, text)
_ARTICLES: list[tuple[str, str, int, str, str]] = [
    ("refunds", "en", 40, "Refunds",
     "You can ask for a refund within 14 days of a charge. Open Billing, pick the charge and "
     "press Request refund. Refunds go back to the card that paid, in 5 to 10 business days."),
    ("refunds", "en", 5, "Refunds",
     "You can ask for a refund within 30 days of a charge. Open Billing, pick the charge and "
     "press Request refund. Refunds reach the card that paid within 3 business days; annual "
     "plans are refunded pro rata."),
    ("cancel", "en", 60, "Cancel your subscription",
     "Cancel any time from Settings, Plan, Cancel plan. You keep access until the end of the "
     "period you paid for, and nothing more is charged."),
    ("invoice", "en", 90, "Download invoices",
     "Every charge has an invoice. Open Billing, Invoices and press Download to get a PDF with "
     "your company name and VAT number."),
    ("vat", "en", 80, "VAT numbers",
     "Add your VAT number under Billing, Tax details. New invoices show it and, inside the EU, "
     "are issued without VAT under the reverse charge rule."),
    ("card-declined", "en", 30, "Card declined",
     "A charge can be declined by your bank for insufficient funds, an expired card or a "
     "security check. Update the card under Billing, Payment method and retry the charge."),
    ("change-card", "en", 45, "Change the payment card",
     "Open Billing, Payment method, press Replace card and enter the new card. The next charge "
     "uses it; pending charges are retried on the new card."),
    ("double-charge", "en", 20, "Charged twice",
     "If a charge appears twice, one is usually a pending authorisation that your bank releases "
     "within 7 days. If both settle, ask for a refund of one from Billing."),
    ("upgrade", "en", 70, "Upgrade your plan",
     "Upgrade from Settings, Plan. You pay the difference for the rest of the period at once "
     "and the new limits apply immediately."),
    ("downgrade", "en", 70, "Downgrade your plan",
     "Downgrades take effect at the end of the current period. Data above the lower plan's "
     "limits is kept read-only for 30 days."),
    ("password-reset", "en", 100, "Reset your password",
     "Press Forgot password on the sign-in page and follow the link we email you. The link "
     "works for one hour and only once."),
    ("two-factor", "en", 95, "Two-factor authentication",
     "Turn on two-factor authentication under Security. Use an authenticator app; keep the "
     "recovery codes somewhere safe, each works once."),
    ("lost-2fa", "en", 50, "Lost your two-factor device",
     "Sign in with a recovery code. Without one, an owner of your workspace can reset your "
     "second factor; support needs a signed request from the workspace owner."),
    ("locked-out", "en", 25, "Account locked",
     "After ten failed sign-ins the account is locked for 30 minutes. Reset your password to "
     "unlock it at once."),
    ("sso", "en", 110, "Single sign-on",
     "Business plans can sign in with SAML single sign-on. Add your identity provider's "
     "metadata under Security, SSO, then test with one user before enforcing it."),
    ("invite", "en", 85, "Invite teammates",
     "Invite people from Settings, Members, Invite. Each seat is billed from the day the "
     "invitation is accepted."),
    ("remove-member", "en", 85, "Remove a member",
     "Remove someone from Settings, Members. Their seat stops being billed at the next charge "
     "and their content stays in the workspace."),
    ("export", "en", 65, "Export your data",
     "Export everything from Settings, Data, Export. You get an email with a ZIP of CSV files "
     "within an hour; the link works for seven days."),
    ("delete-account", "en", 120, "Delete your account",
     "An owner can delete the workspace from Settings, Data, Delete. Data is erased after 30 "
     "days; cancel the deletion before then to restore everything."),
    ("api-keys", "en", 35, "API keys",
     "Create API keys under Developers, Keys. A key is shown once; store it in a secret "
     "manager. Revoke a leaked key at once and create a new one."),
    ("rate-limits", "en", 15, "API rate limits",
     "The API allows 100 requests per second per workspace. A 429 reply carries Retry-After; "
     "wait that many seconds before retrying."),
    ("webhooks", "en", 55, "Webhooks",
     "Add a webhook endpoint under Developers, Webhooks. Deliveries are signed; verify the "
     "signature and answer with a 2xx within 10 seconds or we retry for three days."),
    ("outage", "en", 3, "Service status",
     "Check the status page for incidents. During an incident we post updates every 30 "
     "minutes and a report within five business days."),
    ("slow-app", "en", 40, "The app is slow",
     "Clear the browser cache, disable extensions and try another network. If it stays slow, "
     "send us the time and your workspace name."),
    ("mobile", "en", 75, "Mobile app",
     "The mobile app works offline and syncs when it reconnects. Sign in with the same "
     "account; two-factor codes work as on the web."),
    ("notifications", "en", 60, "Email notifications",
     "Choose which emails you get under Profile, Notifications. Billing and security emails "
     "cannot be turned off."),
    ("trial", "en", 90, "Free trial",
     "The trial lasts 14 days with every feature. Add a card before it ends to keep your data "
     "on a paid plan; otherwise the workspace becomes read-only."),
    ("discounts", "en", 65, "Discounts for non-profits and education",
     "Registered non-profits and schools get 50 percent off. Apply from Billing, Discounts "
     "with proof of status."),
    ("refunds-de", "de", 40, "Rückerstattung",
     "Eine Rückerstattung ist innerhalb von 14 Tagen nach einer Abbuchung möglich. Öffnen Sie "
     "Abrechnung, wählen Sie die Abbuchung und klicken Sie auf Rückerstattung anfordern."),
    ("cancel-de", "de", 60, "Abo kündigen",
     "Kündigen Sie jederzeit unter Einstellungen, Tarif, Tarif kündigen. Der Zugang bleibt "
     "bis zum Ende des bezahlten Zeitraums."),
    ("password-de", "de", 100, "Passwort zurücksetzen",
     "Klicken Sie auf der Anmeldeseite auf Passwort vergessen und folgen Sie dem Link in der "
     "E-Mail. Der Link ist eine Stunde gültig."),
    ("refunds-fr", "fr", 40, "Remboursements",
     "Vous pouvez demander un remboursement dans les 14 jours suivant un paiement, depuis "
     "Facturation, en choisissant le paiement puis Demander un remboursement."),
]  # fmt: skip


def articles() -> list[dict[str, Any]]:
    """Every version of every article, as rows of `Doc` (oldest first)."""
    rows = [
        {
            "id": doc_id,
            "lang": lang,
            "title": title,
            "text": text,
            "updated_at": ANCHOR - timedelta(days=days),
        }
        for doc_id, lang, days, title, text in _ARTICLES
    ]
    return sorted(rows, key=lambda row: row["updated_at"])
